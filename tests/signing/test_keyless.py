"""Keyless for real, offline: sigstore-python against a local Fulcio CA + Rekor log
(``@sigstore/mock`` behind node), verified from a trusted-root file with the server stopped."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from kernelbake.cli import main
from kernelbake.oci import RegistryClient
from kernelbake.signing import formats
from kernelbake.signing._internal.keyless import load_trust_config
from kernelbake.signing.errors import InvalidSignature, UntrustedSigner
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.sign import sign_image
from kernelbake.signing.signer import KeylessSigner
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import ISSUER, SUBJECT, ImageFactory, MockSigstore, make_token, mock_sigstore

pytestmark = [pytest.mark.sigstore, pytest.mark.registry]


def _policy(trusted_root: Path, **identity: str) -> VerifyPolicy:
    ident = identity or {"issuer": ISSUER, "subject": SUBJECT}
    return VerifyPolicy.from_mapping(
        {"identities": [ident], "trusted_root": str(trusted_root)}, source="keyless-policy"
    )


def test_keyless_sign_then_verify_offline_with_the_server_stopped(
    make_image: ImageFactory, client: RegistryClient, tmp_path: Path
) -> None:
    image = make_image()
    with mock_sigstore(tmp_path / "sigstore") as server:
        signer = KeylessSigner(load_trust_config(str(server.trust_config)), make_token())
        result = sign_image(image.tagged, signer, client=client, legacy=True)
        assert result.signer == f"{SUBJECT} (issuer {ISSUER})"
    assert not server.running
    verified = verify_image(image.tagged, _policy(server.trusted_root), client=client)
    assert verified.digest == image.digest
    assert verified.signer == f"{SUBJECT} (issuer {ISSUER})"
    assert verified.key == image.key
    # The bundle carries the certificate and the Rekor entry (SET + inclusion proof).
    ref = image.ref.with_digest(image.digest)
    manifest = client.get_manifest(ref.with_digest(client.referrers(ref)[0].digest))
    bundle = json.loads(client.get_blob(ref, manifest.layers[0].digest))
    material = bundle["verificationMaterial"]
    assert "certificate" in material
    (entry,) = material["tlogEntries"]
    assert entry["kindVersion"] == {"kind": "dsse", "version": "0.0.1"}
    assert entry["inclusionPromise"]["signedEntryTimestamp"]
    assert entry["inclusionProof"]["checkpoint"]["envelope"]


def test_identity_regex_and_issuer_are_enforced(
    make_image: ImageFactory, client: RegistryClient, sigstore_mock: MockSigstore
) -> None:
    image = make_image()
    signer = KeylessSigner(load_trust_config(str(sigstore_mock.trust_config)), make_token())
    sign_image(image.tagged, signer, client=client)
    root = sigstore_mock.trusted_root
    ok = _policy(
        root, issuer=ISSUER, subject_regex=r"https://ci\.kernelbake\.test/acme/images/.*@refs/heads/main"
    )
    assert verify_image(image.tagged, ok, client=client).signer.startswith(SUBJECT)
    wrong_subject = _policy(root, issuer=ISSUER, subject="https://ci.kernelbake.test/someone/else")
    with pytest.raises(UntrustedSigner, match="someone/else"):
        verify_image(image.tagged, wrong_subject, client=client)
    wrong_issuer = _policy(root, issuer="https://token.actions.githubusercontent.com", subject=SUBJECT)
    with pytest.raises(UntrustedSigner, match=r"token\.actions"):
        verify_image(image.tagged, wrong_issuer, client=client)
    # A regex must match the whole identity, not a part of it.
    partial = _policy(root, issuer=ISSUER, subject_regex="acme")
    with pytest.raises(UntrustedSigner):
        verify_image(image.tagged, partial, client=client)


@pytest.mark.parametrize("legacy", [False, True], ids=["bundle", "legacy-tags"])
def test_certificate_from_another_ca_is_untrusted(
    make_image: ImageFactory,
    client: RegistryClient,
    sigstore_mock: MockSigstore,
    tmp_path: Path,
    legacy: bool,
) -> None:
    from tests.signing.tamper import drop_bundles

    image = make_image()
    with mock_sigstore(tmp_path / "rogue") as rogue:
        signer = KeylessSigner(load_trust_config(str(rogue.trust_config)), make_token())
        sign_image(image.tagged, signer, client=client, legacy=legacy)
    if legacy:
        drop_bundles(client, image)  # only cosign 2's .sig/.att remain
    # Same identity, but certified by a CA the trusted root does not list.
    with pytest.raises(UntrustedSigner, match="does not chain to the trusted root"):
        verify_image(image.tagged, _policy(sigstore_mock.trusted_root), client=client)


def test_tampered_keyless_bundle_is_invalid(
    make_image: ImageFactory, client: RegistryClient, sigstore_mock: MockSigstore
) -> None:
    from tests.signing.tamper import rewrite_bundles

    image = make_image()
    signer = KeylessSigner(load_trust_config(str(sigstore_mock.trust_config)), make_token())
    sign_image(image.tagged, signer, client=client)

    def flip_signature(bundle: dict[str, Any]) -> dict[str, Any]:
        sig = bytearray(base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"]))
        sig[-3] ^= 0x01
        bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
        return bundle

    rewrite_bundles(client, image, flip_signature)
    with pytest.raises(InvalidSignature, match="does not verify"):
        verify_image(image.tagged, _policy(sigstore_mock.trusted_root), client=client)


def test_cli_keyless_sign_with_env_token(
    make_image: ImageFactory,
    sigstore_mock: MockSigstore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    image = make_image()
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.setenv("KERNELBAKE_OIDC_TOKEN", make_token())
    monkeypatch.setenv("KERNELBAKE_TRUST_CONFIG", str(sigstore_mock.trust_config))
    assert main(["sign", "--keyless", image.tagged]) == 0
    assert f"by {SUBJECT} (issuer {ISSUER})" in capsys.readouterr().out
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "verify:\n"
        f"  identities:\n    - issuer: {ISSUER}\n      subject_regex: '^https://ci\\.kernelbake\\.test/acme/.*$'\n"
        f"  trusted_root: {sigstore_mock.trusted_root}\n"
    )
    assert main(["verify", image.tagged, "--policy", str(policy)]) == 0
    assert capsys.readouterr().out.startswith(f"verified {image.pinned}: signed by {SUBJECT}")


def test_legacy_keyless_tags_verify_offline_and_tampering_is_caught(
    make_image: ImageFactory, client: RegistryClient, tmp_path: Path
) -> None:
    from tests.signing.tamper import drop_bundles, rewrite_legacy_annotations

    image = make_image()
    with mock_sigstore(tmp_path / "sigstore") as server:
        signer = KeylessSigner(load_trust_config(str(server.trust_config)), make_token())
        sign_image(image.tagged, signer, client=client, legacy=True)
    drop_bundles(client, image)  # only cosign 2's .sig/.att remain
    policy = _policy(server.trusted_root)
    verified = verify_image(image.tagged, policy, client=client)
    assert verified.signer == f"{SUBJECT} (issuer {ISSUER})"
    assert verified.key == image.key

    def other_log_time(ann: dict[str, str]) -> dict[str, str]:
        rekor = json.loads(ann[formats.ANN_REKOR_BUNDLE])
        rekor["Payload"]["integratedTime"] += 1  # the SET no longer covers it
        return {**ann, formats.ANN_REKOR_BUNDLE: json.dumps(rekor)}

    rewrite_legacy_annotations(client, image, formats.SIG_SUFFIX, other_log_time)
    with pytest.raises(InvalidSignature, match="does not verify"):
        verify_image(image.tagged, policy, client=client)
