"""Signing a digest again (every ``make image`` signs what it pushed, unchanged or not): what the
same key already signed, and what verifies, is not signed again; anything missing is added."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.oci import RegistryClient, RegistryNotFound
from kernelbake.signing import formats
from kernelbake.signing.sign import sign_image
from kernelbake.signing.signer import KeySigner, LegacySignature, SignedStatement
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import PushedImage
from tests.signing.tamper import rewrite_bundles

pytestmark = pytest.mark.registry


def _stored(client: RegistryClient, image: PushedImage) -> tuple[int, int, int]:
    """(referrers listed, .sig layers, .att layers)."""
    ref = image.ref.with_digest(image.digest)
    layers = []
    for suffix in (formats.SIG_SUFFIX, formats.ATT_SUFFIX):
        try:
            layers.append(
                len(client.get_manifest(ref.with_tag(formats.legacy_tag(image.digest, suffix))).layers)
            )
        except RegistryNotFound:
            layers.append(0)
    return len(client.referrers(ref)), layers[0], layers[1]


def test_signing_an_unchanged_digest_again_adds_nothing(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()
    first = sign_image(image.tagged, keys.signer, client=client, legacy=True)
    assert first.already == () and len(first.referrers) == 2
    assert _stored(client, image) == (2, 1, 1)
    for _ in range(2):
        again = sign_image(image.tagged, keys.signer, client=client, legacy=True)
        assert again.already == ("signature", "attestation", ".sig", ".att")
        assert again.referrers == () and again.legacy_tags == ()
        assert again.describe() == (
            f"{image.pinned}: already signed by key {keys.public.fingerprint}, "
            "skipped (signature, attestation, .sig, .att)"
        )
    assert _stored(client, image) == (2, 1, 1)
    assert verify_image(image.pinned, keys.policy(), client=client).skipped == ()


def test_another_key_signs_and_the_first_is_still_skipped(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, other_keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    other = sign_image(image.tagged, other_keys.signer, client=client)
    assert other.already == () and len(other.referrers) == 2
    assert sign_image(image.tagged, keys.signer, client=client).already == ("signature", "attestation")
    assert sign_image(image.tagged, other_keys.signer, client=client).already == ("signature", "attestation")
    assert _stored(client, image) == (4, 0, 0)


def test_what_is_missing_is_added(make_image: ImageFactory, client: RegistryClient, keys: KeyPair) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client, attest=False)
    assert _stored(client, image) == (1, 0, 0)
    # The attestation was never made: it is now; the signature is not repeated.
    done = sign_image(image.tagged, keys.signer, client=client)
    assert done.already == ("signature",) and len(done.referrers) == 1
    assert _stored(client, image) == (2, 0, 0)
    # The legacy tags were never written: they are now, from one new attestation.
    done = sign_image(image.tagged, keys.signer, client=client, legacy=True)
    assert done.already == ("signature", "attestation") and done.referrers == ()
    assert len(done.legacy_tags) == 2
    assert _stored(client, image) == (2, 1, 1)
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.attestation["key"] == str(image.key)


def test_a_signature_that_does_not_verify_does_not_count(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)

    def tampered(bundle: dict[str, object]) -> dict[str, object]:
        envelope = dict(bundle["dsseEnvelope"])  # type: ignore[call-overload]
        envelope["signatures"] = [{"keyid": "", "sig": "MEUCIQ" + "A" * 90}]
        return {**bundle, "dsseEnvelope": envelope}

    rewrite_bundles(client, image, tampered)
    done = sign_image(image.tagged, keys.signer, client=client)
    assert done.already == () and len(done.referrers) == 2
    assert verify_image(image.pinned, keys.policy(), client=client).signer.endswith(keys.public.fingerprint)


@dataclasses.dataclass(frozen=True)
class _NoKeySigner:
    """A signer with no key to look its signatures up by, as a keyless one: always signs."""

    inner: KeySigner

    @property
    def identity(self) -> str:
        return self.inner.identity

    @property
    def public_key(self) -> None:
        return None

    def sign_statement(self, statement: bytes) -> SignedStatement:
        return self.inner.sign_statement(statement)

    def sign_payload(self, payload: bytes) -> LegacySignature:
        return self.inner.sign_payload(payload)

    def vouch(self, payload: bytes, bundle: bytes) -> Mapping[str, str]:
        return self.inner.vouch(payload, bundle)


def test_a_signer_without_a_key_always_signs(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()
    signer = _NoKeySigner(keys.signer)
    sign_image(image.tagged, signer, client=client)
    assert sign_image(image.tagged, signer, client=client).already == ()
    assert _stored(client, image) == (4, 0, 0)


def test_cli_says_it_skipped(
    make_image: ImageFactory,
    keys: KeyPair,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.delenv("KERNELBAKE_SIGNING_KEY_PASSWORD", raising=False)
    monkeypatch.delenv("COSIGN_PASSWORD", raising=False)
    image = make_image()
    argv = ["sign", "--key", str(keys.private_path), image.tagged]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"signed and attested {image.pinned} by key sha256:")
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out == (
        f"{image.pinned}: already signed by key {keys.public.fingerprint}, skipped (signature, attestation)\n"
    )
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["already"] == ["signature", "attestation"] and doc["referrers"] == []
