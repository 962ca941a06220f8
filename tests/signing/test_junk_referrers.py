"""Junk attached next to a valid signature cannot deny the image, nor make verification slow:
any attached signature that satisfies the policy is enough (as with cosign); the rest are skipped
with a note; reads are bounded in count and size. With nothing valid, verification fails closed
and says why."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from kernelbake.cli import main
from kernelbake.oci import RegistryClient
from kernelbake.oci.types import sha256_digest
from kernelbake.signing import discover, formats, intoto
from kernelbake.signing.errors import MalformedSignature, Unsigned, UntrustedSigner, VerificationFailed
from kernelbake.signing.keys import PublicKey
from kernelbake.signing.predicate import PREDICATE_TYPE
from kernelbake.signing.sign import sign_image
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import PushedImage
from tests.signing.tamper import (
    copy_signatures,
    delete_blob,
    drop_bundles,
    list_around,
    list_referrers,
    prepend_legacy_layers,
    push_lookalikes,
    push_referrer,
    replace_bundles,
)
from tests.support.attacks import attach_statement

pytestmark = pytest.mark.registry

FIVE_MIB = 5 << 20
SBOM = "application/vnd.example.sbom.v1+json"


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every body byte the registry client reads, whatever the request."""
    seen: list[int] = []
    real = requests.Response.iter_content

    def counting(self: requests.Response, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for chunk in real(self, *args, **kwargs):
            seen.append(len(chunk))
            yield chunk

    monkeypatch.setattr(requests.Response, "iter_content", counting)
    yield seen


def _gone_blob(client: RegistryClient, image: PushedImage) -> tuple[str, list[dict[str, Any]]]:
    blob = json.dumps({"mediaType": formats.BUNDLE_V03, "junk": image.digest}).encode()
    entry = push_referrer(client, image, blob)
    delete_blob(image, sha256_digest(blob))
    return "is gone", [entry]


def _big_bundle(client: RegistryClient, image: PushedImage) -> tuple[str, list[dict[str, Any]]]:
    entry = push_referrer(client, image, b"{" + b" " * FIVE_MIB + b"}")
    return f"over the {discover.MAX_ARTIFACT_BYTES}-byte limit", [entry]


def _big_bundle_declared_small(
    client: RegistryClient, image: PushedImage
) -> tuple[str, list[dict[str, Any]]]:
    # The manifest lies about the layer's size: the limit holds on what the registry sends.
    entry = push_referrer(client, image, b"[" + b" " * FIVE_MIB + b"]", declared_size=900)
    return f"over the {discover.MAX_ARTIFACT_BYTES}-byte limit", [entry]


def _other_types_first(client: RegistryClient, image: PushedImage) -> tuple[str, list[dict[str, Any]]]:
    entries = [
        push_referrer(client, image, b'{"sbom": %d}' % i, artifact_type=SBOM, layer_type=SBOM)
        for i in range(64)
    ]
    return f"64 times: not a Sigstore bundle (artifactType '{SBOM}')", entries


def _junk_bundles_first(client: RegistryClient, image: PushedImage) -> tuple[str, list[dict[str, Any]]]:
    # Bundle-typed but no signature: the real ones, vouched for by the key, are read apart from
    # them; the junk fills the bound of the others.
    entries = [push_referrer(client, image, b'{"junk": %d}' % i) for i in range(64)]
    examined = discover.MAX_BUNDLES
    return f"{64 - examined} times: not examined: only {discover.MAX_BUNDLES} candidate bundles are", entries


Junk = Callable[[RegistryClient, PushedImage], tuple[str, list[dict[str, Any]]]]
JUNK: dict[str, Junk] = {
    "blob-deleted": _gone_blob,
    "5MiB-bundle": _big_bundle,
    "5MiB-bundle-declared-900-bytes": _big_bundle_declared_small,
    "64-other-artifact-types-first": _other_types_first,
    "64-junk-bundles-first": _junk_bundles_first,
}


@pytest.mark.parametrize("position", ["listed-first", "listed-last"])
@pytest.mark.parametrize("kind", list(JUNK))
def test_a_signed_image_verifies_next_to_junk(
    make_image: ImageFactory,
    client: RegistryClient,
    keys: KeyPair,
    kind: str,
    position: str,
    bytes_read: list[int],
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    expected, entries = JUNK[kind](client, image)
    list_referrers(client, image, entries, first=position == "listed-first")
    fresh = RegistryClient(client.settings, timeout=10.0)  # nothing cached from the pushes
    bytes_read.clear()

    verified = verify_image(image.pinned, keys.policy(), client=fresh)

    assert verified.signer == f"key {keys.public.fingerprint}"
    assert verified.attestation["key"] == str(image.key)
    note = verified.skipped_note()
    assert note is not None and note.startswith(f"skipped {len(entries)} attached artifact")
    assert expected in note, note
    # Neither a 5 MiB blob nor 64 referrers' worth of junk is downloaded.
    assert sum(bytes_read) < 1 << 20, sum(bytes_read)


def test_cli_says_what_it_skipped(
    make_image: ImageFactory,
    client: RegistryClient,
    keys: KeyPair,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    _, entries = _gone_blob(client, image)
    list_referrers(client, image, entries)
    assert main(["verify", image.tagged, "--key", str(keys.public_path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"verified {image.pinned}: signed by key ")
    assert err.startswith("kernelbake verify: note: skipped 1 attached artifact: ")
    assert "is gone" in err and len(err.splitlines()) == 1
    assert main(["verify", image.tagged, "--key", str(keys.public_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verified"] is True
    assert [s["count"] for s in doc["skipped"]] == [1] and "is gone" in doc["skipped"][0]["reason"]


def test_a_legacy_signature_is_enough_when_every_bundle_is_junk(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client, legacy=True)
    replace_bundles(client, image, b"not json at all")
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.signer == f"key {keys.public.fingerprint}"
    note = verified.skipped_note()
    assert note is not None and note.startswith("skipped 2 attached artifacts") and "not JSON" in note


def test_a_trusted_signature_among_other_signers_and_junk(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, other_keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, other_keys.signer, client=client)
    sign_image(image.tagged, keys.signer, client=client)
    _, entries = _gone_blob(client, image)
    list_referrers(client, image, entries)
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.signer == f"key {keys.public.fingerprint}"
    assert sum(s.count for s in verified.skipped) == 3  # the intruder's two bundles, the gone one


@pytest.mark.parametrize(
    ("kinds", "error", "start"),
    [
        # Nothing that could be read as a signature: unsigned, and what was there.
        (
            [
                "blob-deleted",
                "5MiB-bundle",
                "5MiB-bundle-declared-900-bytes",
                "64-other-artifact-types-first",
            ],
            Unsigned,
            "no usable signature found; skipped 67 attached artifacts: ",
        ),
        # Bundle-shaped junk: the best reason (a malformed bundle), and that the others were skipped.
        (list(JUNK), MalformedSignature, "no trusted signature: "),
    ],
)
def test_only_junk_fails_closed_with_the_reasons(
    make_image: ImageFactory,
    client: RegistryClient,
    keys: KeyPair,
    kinds: list[str],
    error: type[VerificationFailed],
    start: str,
) -> None:
    image = make_image()
    entries = [entry for kind in kinds for entry in JUNK[kind](client, image)[1]]
    list_referrers(client, image, entries)
    with pytest.raises(error) as failed:
        verify_image(image.pinned, keys.policy(), client=client)
    message = str(failed.value)
    assert type(failed.value) is error
    assert message.startswith(f"{image.pinned}: {start}"), message
    # Every entry is accounted for: the best candidate named, all others counted as skipped.
    others = len(entries) - (error is not Unsigned)
    assert f"skipped {others} {'attached' if error is Unsigned else 'other'} artifacts" in message
    assert "\n" not in message


def test_junk_next_to_an_untrusted_signature_names_the_signer(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, other_keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, other_keys.signer, client=client)
    _, entries = _other_types_first(client, image)
    list_referrers(client, image, entries)
    with pytest.raises(UntrustedSigner) as failed:
        verify_image(image.pinned, keys.policy(), client=client)
    message = str(failed.value)
    assert other_keys.public.fingerprint in message
    assert "skipped 65 other artifacts" in message and "64 times: not a Sigstore bundle" in message


# -- look-alikes: any number of them, before and after the real signature ---------------------

LOOKALIKES = 250  # before the real referrers, and as many again after them (the newest)


@pytest.fixture
def verifications(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The fingerprint of the key of every signature verification made."""
    made: list[str] = []
    real = PublicKey.verifies

    def counting(self: PublicKey, signature: bytes, data: bytes) -> bool:
        made.append(self.fingerprint)
        return real(self, signature, data)

    monkeypatch.setattr(PublicKey, "verifies", counting)
    yield made


def _real_annotations(client: RegistryClient, image: PushedImage) -> list[dict[str, str]]:
    return [dict(d.annotations) for d in client.referrers(image.ref.with_digest(image.digest))]


def _copied(real: list[dict[str, str]], keys: KeyPair, other: KeyPair) -> Callable[[int], dict[str, str]]:
    # Every annotation of a real referrer, vouch included: the vouch names the real bundle.
    return lambda i: {**real[i % len(real)], "junk": str(i)}


def _forged(real: list[dict[str, str]], keys: KeyPair, other: KeyPair) -> Callable[[int], dict[str, str]]:
    # The real annotations and the trusted key's hint, vouching for the junk layer with a
    # signature that key never made (another key's, over the same payload shape).
    junk_layer = sha256_digest(b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json"}')

    def forge(i: int) -> dict[str, str]:
        payload = formats.vouch_payload("sha256:" + f"{i:064x}", junk_layer)
        signature = base64.b64encode(other.private.sign(payload)).decode()
        vouch = {formats.ANN_VOUCH_LAYER: junk_layer, formats.ANN_VOUCH_SIGNATURE: signature}
        return {**real[i % len(real)], **vouch}

    return forge


def _untrusted_vouch(
    real: list[dict[str, str]], keys: KeyPair, other: KeyPair
) -> Callable[[int], dict[str, str]]:
    # A genuine vouch by a key the policy does not trust: an ordinary candidate, within the bound.
    return lambda i: {**real[i % len(real)], formats.ANN_VOUCH_KEY: other.public.hint, "junk": str(i)}


def _predicate_only(
    real: list[dict[str, str]], keys: KeyPair, other: KeyPair
) -> Callable[[int], dict[str, str]]:
    # cosign's own annotation, no vouch: what denied a signed image when the bound was all there was.
    return lambda i: {formats.ANN_BUNDLE_PREDICATE: intoto.COSIGN_SIGN_PREDICATE, "junk": str(i)}


LOOKALIKE_KINDS = {
    "copied-annotations": (_copied, "vouches for the same bundle as"),
    "forged-vouch": (_forged, "vouch by a trusted key does not verify for this digest"),
    "vouch-by-an-untrusted-key": (_untrusted_vouch, "not examined: only 32 candidate bundles are"),
    "predicate-annotation-only": (_predicate_only, "not examined: only 32 candidate bundles are"),
}


@pytest.mark.parametrize("kind", list(LOOKALIKE_KINDS))
def test_no_number_of_lookalikes_hides_a_key_signed_image(
    make_image: ImageFactory,
    client: RegistryClient,
    keys: KeyPair,
    other_keys: KeyPair,
    kind: str,
    bytes_read: list[int],
    verifications: list[str],
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    make, expected = LOOKALIKE_KINDS[kind]
    annotate = make(_real_annotations(client, image), keys, other_keys)
    before = push_lookalikes(client, image, LOOKALIKES, annotate)
    after = push_lookalikes(client, image, LOOKALIKES, lambda i: annotate(LOOKALIKES + i))
    list_around(client, image, before, after)
    fresh = RegistryClient(client.settings, timeout=10.0)
    bytes_read.clear()
    verifications.clear()

    verified = verify_image(image.pinned, keys.policy(), client=fresh)

    assert verified.signer == f"key {keys.public.fingerprint}"
    assert verified.attestation["key"] == str(image.key)
    note = verified.skipped_note()
    # Every look-alike is accounted for (copies of a vouch: the real bundle, read once).
    assert note is not None and note.startswith(f"skipped {2 * LOOKALIKES} attached artifacts: "), note
    assert expected in note, note
    # The listing (~500 entries) and at most 32 small junk referrers plus the real two: bounded,
    # whatever the count. Vouch checks: at most one per listed referrer, and per distinct claim.
    assert sum(bytes_read) < 2 << 20, sum(bytes_read)
    vouch_checks = sum(1 for f in verifications if f == keys.public.fingerprint)
    assert vouch_checks <= 2 * LOOKALIKES + 2 + 2  # every listed vouch, then the two real bundles


def test_a_vouch_copied_from_another_image_does_not_sign_this_one(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    # The vouch signs the subject digest too: replayed on an unsigned image it is junk.
    signed = make_image(tag="signed")
    unsigned = make_image(tag="unsigned", repo=signed.ref.repository)
    sign_image(signed.tagged, keys.signer, client=client)
    copy_signatures(client, signed, unsigned)
    with pytest.raises(VerificationFailed) as failed:
        verify_image(unsigned.pinned, keys.policy(), client=client)
    assert "vouch by a trusted key does not verify for this digest" in str(failed.value)


def test_an_edited_manifest_that_keeps_the_vouch_still_reads_the_signed_bundle(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    # The vouch names the bundle by digest: swapping the manifest's layer (and keeping the
    # annotations) leads verification to the bundle the key signed, not the substitute.
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    ref = image.ref.with_digest(image.digest)
    real = list(client.referrers(ref))
    entries = push_lookalikes(client, image, len(real), lambda i: dict(real[i].annotations), blob=b"junk")
    drop_bundles(client, image)
    list_referrers(client, image, entries)
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.signer == f"key {keys.public.fingerprint}" and verified.skipped_note() is None
    assert verified.attestation["key"] == str(image.key)


def test_legacy_layers_are_tried_newest_first_within_their_bound(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    # cosign appends each signature to .sig: older junk (or signatures by a rotated-out key)
    # beyond the bound does not hide the newest.
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client, legacy=True)
    drop_bundles(client, image)
    prepend_legacy_layers(client, image, discover.MAX_LEGACY_LAYERS + 4)
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.signer == f"key {keys.public.fingerprint}"
    note = verified.skipped_note()
    assert note is not None and note.startswith(f"skipped {discover.MAX_LEGACY_LAYERS + 4} attached")
    assert f"5 times: not examined: only the newest {discover.MAX_LEGACY_LAYERS} layers are" in note
    assert "15 times: no trusted key" in note


@pytest.mark.parametrize("position", ["listed-first", "listed-last"])
def test_any_trusted_attestation_that_describes_the_image_is_enough(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, position: str
) -> None:
    image = make_image()
    predicate = sign_image(image.tagged, keys.signer, client=client).predicate
    assert predicate is not None
    # Another trusted attestation for this digest that describes another build.
    wrong = dataclasses.replace(predicate, cache_layer_digest="sha256:" + "e" * 64)
    digest = attach_statement(image.tagged, keys.signer, PREDICATE_TYPE, wrong.to_json(), client=client)
    ref = image.ref.with_digest(image.digest)
    entries = [d.to_json() for d in client.referrers(ref)]
    wrong_first = position == "listed-first"
    drop_bundles(client, image)
    list_referrers(client, image, sorted(entries, key=lambda e: (e["digest"] == digest) != wrong_first))
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.attestation["cacheManifest"]["layerDigest"] == predicate.cache_layer_digest
    note = verified.skipped_note()
    if wrong_first:  # the oldest: the right one, newer, satisfied the policy before it was needed
        assert note is None
    else:  # the newest: tried first, and skipped
        assert note is not None and note.startswith("skipped 1 attached artifact: bundle sha256:")
        assert f"the attestation says sha256:{'e' * 64}" in note
