"""No number of look-alike referrers hides a keyless signature made by kernelbake: its referrers
carry a keyless vouch (the leaf certificate and a signature by its key over the image and bundle
digests), checked from the listing alone. Bundles without a vouch (cosign's) are found within
the bounded fallback, which junk appended after the signing cannot starve. Counted in registry
requests, not seconds. The in-memory registry and the local Sigstore (``@sigstore/mock``)."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from kernelbake.oci import RegistryClient
from kernelbake.oci.types import sha256_digest
from kernelbake.signing import discover, formats, intoto
from kernelbake.signing._internal import certs
from kernelbake.signing._internal.keyless import load_trust_config
from kernelbake.signing.errors import VerificationFailed
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.sign import sign_image
from kernelbake.signing.signer import KeylessSigner
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import ISSUER, SUBJECT, ImageFactory, MockSigstore, make_token
from tests.signing.images import PushedImage
from tests.signing.tamper import list_around, push_lookalikes, rewrite_bundles

pytestmark = [pytest.mark.sigstore]

LOOKALIKES = 150  # before the real referrers, and as many again after them: 300 in all
SIGNER = f"{SUBJECT} (issuer {ISSUER})"
JUNK_LAYER = sha256_digest(b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}')


@pytest.fixture(scope="module")
def image_registry(memory_registry: str) -> str:
    return memory_registry


@pytest.fixture
def requests_made(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """``METHOD path`` of every registry request any RegistryClient makes."""
    seen: list[str] = []
    real = RegistryClient._request

    def recording(self: RegistryClient, method: str, ref: Any, path: str, **kw: Any) -> Any:
        seen.append(f"{method} {path}")
        return real(self, method, ref, path, **kw)

    monkeypatch.setattr(RegistryClient, "_request", recording)
    yield seen


def _policy(server: MockSigstore) -> VerifyPolicy:
    return VerifyPolicy.from_mapping(
        {"identities": [{"issuer": ISSUER, "subject": SUBJECT}], "trusted_root": str(server.trusted_root)},
        source="keyless-policy",
    )


def _signed(make_image: ImageFactory, client: RegistryClient, server: MockSigstore) -> PushedImage:
    image = make_image()
    signer = KeylessSigner(load_trust_config(str(server.trust_config)), make_token())
    sign_image(image.tagged, signer, client=client)
    return image


def _real(client: RegistryClient, image: PushedImage) -> list[dict[str, str]]:
    return [dict(d.annotations) for d in client.referrers(image.ref.with_digest(image.digest))]


def _sign(key: ec.EllipticCurvePrivateKey, subject: str, layer: str) -> str:
    payload = formats.vouch_payload(subject, layer)
    return base64.b64encode(key.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()


def _der_utf8(text: str) -> bytes:
    body = text.encode()
    assert len(body) < 128
    return bytes([0x0C, len(body)]) + body


def _self_issued(real_cert: x509.Certificate) -> tuple[str, ec.EllipticCurvePrivateKey]:
    """A certificate claiming the trusted identity, issuer name and all, that the trusted CA
    never signed (base64 DER), and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(real_cert.issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(minutes=10))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(SUBJECT)]), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .add_extension(x509.UnrecognizedExtension(certs.ISSUER_V2, _der_utf8(ISSUER)), critical=False)
        .sign(ec.generate_private_key(ec.SECP256R1()), hashes.SHA256())
    )
    from cryptography.hazmat.primitives import serialization

    return base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode(), key


Annotate = Callable[[int], dict[str, str]]


def _copied(real: list[dict[str, str]], image: PushedImage) -> Annotate:
    # Every annotation of a real referrer, its vouch included: it names the real bundle.
    return lambda i: {**real[i % len(real)], "junk": str(i)}


def _real_certificate_forged_signature(real: list[dict[str, str]], image: PushedImage) -> Annotate:
    # The real (trusted, chaining) certificate, vouching for the junk layer with another key.
    def forge(i: int) -> dict[str, str]:
        other = ec.generate_private_key(ec.SECP256R1())
        vouch = {
            formats.ANN_VOUCH_LAYER: JUNK_LAYER,
            formats.ANN_VOUCH_SIGNATURE: _sign(other, image.digest, JUNK_LAYER),
        }
        return {**real[i % len(real)], **vouch, "junk": str(i)}

    return forge


def _self_issued_certificate(real: list[dict[str, str]], image: PushedImage) -> Annotate:
    # A distinct certificate per referrer claiming the trusted identity, its key signing a vouch
    # for the junk layer and this very image: everything verifies but the chain to the root.
    leaf = x509.load_der_x509_certificate(base64.b64decode(real[0][formats.ANN_VOUCH_CERTIFICATE]))

    def forge(i: int) -> dict[str, str]:
        certificate, key = _self_issued(leaf)
        return {
            **real[i % len(real)],
            formats.ANN_VOUCH_LAYER: JUNK_LAYER,
            formats.ANN_VOUCH_CERTIFICATE: certificate,
            formats.ANN_VOUCH_SIGNATURE: _sign(key, image.digest, JUNK_LAYER),
        }

    return forge


def _predicate_only(real: list[dict[str, str]], image: PushedImage) -> Annotate:
    # cosign's own annotation, no vouch: what denied a signed image when 32 candidates were all.
    return lambda i: {formats.ANN_BUNDLE_PREDICATE: intoto.COSIGN_SIGN_PREDICATE, "junk": str(i)}


LOOKALIKE_KINDS: dict[str, tuple[Callable[[list[dict[str, str]], PushedImage], Annotate], str]] = {
    "copied-vouch": (_copied, "vouches for the same bundle as"),
    "real-certificate-forged-signature": (
        _real_certificate_forged_signature,
        "vouch by a trusted identity's certificate does not verify for this digest",
    ),
    # Not from the trusted CA: no vouch this policy can use, an ordinary (bounded) candidate.
    "self-issued-certificate": (_self_issued_certificate, "not examined: only 32 candidate bundles are"),
    "predicate-annotation-only": (_predicate_only, "not examined: only 32 candidate bundles are"),
}


@pytest.mark.parametrize("kind", list(LOOKALIKE_KINDS))
def test_no_number_of_lookalikes_hides_a_keyless_signed_image(
    make_image: ImageFactory,
    client: RegistryClient,
    sigstore_mock: MockSigstore,
    kind: str,
    requests_made: list[str],
) -> None:
    image = _signed(make_image, client, sigstore_mock)
    real = _real(client, image)
    assert all(formats.ANN_VOUCH_CERTIFICATE in a for a in real), real
    make, expected = LOOKALIKE_KINDS[kind]
    annotate = make(real, image)
    before = push_lookalikes(client, image, LOOKALIKES, annotate)
    after = push_lookalikes(client, image, LOOKALIKES, lambda i: annotate(LOOKALIKES + i))
    list_around(client, image, before, after)
    junk = {e["digest"] for e in before + after}
    fresh = RegistryClient(client.settings, timeout=10.0)
    requests_made.clear()

    verified = verify_image(image.pinned, _policy(sigstore_mock), client=fresh)

    assert verified.signer == SIGNER
    assert verified.attestation["key"] == str(image.key)
    note = verified.skipped_note()
    assert note is not None and note.startswith(f"skipped {2 * LOOKALIKES} attached artifacts: "), note
    assert expected in note, note
    # Bounded work, whatever the count: the vouched bundles are read by digest, junk with a vouch
    # that claims the trusted identity is never fetched, other junk at most MAX_BUNDLES times.
    fetched = [r for r in requests_made if r.startswith("GET manifests/") and r.split("/")[1] in junk]
    if kind in ("predicate-annotation-only", "self-issued-certificate"):
        assert len(fetched) == discover.MAX_BUNDLES, fetched
    else:
        assert fetched == []
    assert len(requests_made) <= 2 * discover.MAX_BUNDLES + 20, requests_made


def _unvouched(make_image: ImageFactory, client: RegistryClient, server: MockSigstore) -> PushedImage:
    """A keyless-signed image whose referrers carry no vouch, as cosign writes them."""
    image = _signed(make_image, client, server)
    rewrite_bundles(client, image, lambda bundle: bundle)
    assert not any(formats.ANN_VOUCH_CERTIFICATE in a for a in _real(client, image))
    return image


def test_an_unvouched_bundle_is_not_starved_by_junk_appended_after_it(
    make_image: ImageFactory, client: RegistryClient, sigstore_mock: MockSigstore, requests_made: list[str]
) -> None:
    # cosign-written bundles (no kernelbake vouch): the oldest candidates stay in the examined
    # half, however many look-alikes are appended after the signing.
    image = _unvouched(make_image, client, sigstore_mock)
    real = _real(client, image)
    after = push_lookalikes(client, image, 2 * LOOKALIKES, _predicate_only(real, image))
    list_around(client, image, [], after)
    fresh = RegistryClient(client.settings, timeout=10.0)
    requests_made.clear()
    verified = verify_image(image.pinned, _policy(sigstore_mock), client=fresh)
    assert verified.signer == SIGNER
    note = verified.skipped_note()
    assert note is not None and f"{2 * LOOKALIKES - discover.MAX_BUNDLES + 2} times: not examined" in note
    assert len(requests_made) <= 2 * discover.MAX_BUNDLES + 20, requests_made


def test_unvouched_bundles_between_enough_junk_fail_closed_and_say_so(
    make_image: ImageFactory, client: RegistryClient, sigstore_mock: MockSigstore
) -> None:
    # The limit, as documented: with no vouch, junk both before (pushed before the signing) and
    # after it fills both halves of the bound. Verification fails closed and names the bound.
    image = _unvouched(make_image, client, sigstore_mock)
    annotate = _predicate_only(_real(client, image), image)
    before = push_lookalikes(client, image, discover.MAX_BUNDLES, annotate)
    after = push_lookalikes(client, image, discover.MAX_BUNDLES, lambda i: annotate(100 + i))
    list_around(client, image, before, after)
    with pytest.raises(VerificationFailed) as failed:
        verify_image(image.pinned, _policy(sigstore_mock), client=client)
    assert "not examined: only 32 candidate bundles are" in str(failed.value)


def test_a_keyless_vouch_copied_from_another_image_does_not_sign_this_one(
    make_image: ImageFactory, client: RegistryClient, sigstore_mock: MockSigstore, tmp_path: Path
) -> None:
    from tests.signing.tamper import copy_signatures

    signed = _signed(make_image, client, sigstore_mock)
    unsigned = make_image(tag="unsigned", repo=signed.ref.repository)
    copy_signatures(client, signed, unsigned)
    with pytest.raises(VerificationFailed) as failed:
        verify_image(unsigned.pinned, _policy(sigstore_mock), client=client)
    assert "vouch by a trusted identity's certificate does not verify for this digest" in str(failed.value)


def test_a_vouch_for_an_identity_the_policy_does_not_trust_is_an_ordinary_candidate(
    make_image: ImageFactory, client: RegistryClient, sigstore_mock: MockSigstore
) -> None:
    image = _signed(make_image, client, sigstore_mock)
    other = VerifyPolicy.from_mapping(
        {
            "identities": [{"issuer": ISSUER, "subject": "https://ci.kernelbake.test/someone/else"}],
            "trusted_root": str(sigstore_mock.trusted_root),
        },
        source="other-policy",
    )
    with pytest.raises(VerificationFailed, match="someone/else"):
        verify_image(image.pinned, other, client=client)
