"""Real cosign both ways: ``cosign verify``/``verify-attestation`` accept what kernelbake signs,
and ``kernelbake verify`` accepts what cosign signs, in the bundle format (cosign 3.1.1,
``--new-bundle-format``) and the legacy ``.sig``/``.att`` format (cosign 2.5.0)."""

from __future__ import annotations

import base64
import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kernelbake.oci import RegistryClient
from kernelbake.oci import types as mt
from kernelbake.remote import read_cache_manifest, read_image
from kernelbake.signing import discover, formats, intoto
from kernelbake.signing._internal.keyless import load_trust_config
from kernelbake.signing.errors import UntrustedSigner, VerificationFailed
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.predicate import PREDICATE_TYPE, predicate_for
from kernelbake.signing.sign import sign_image
from kernelbake.signing.signer import KeylessSigner
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import (
    ISSUER,
    SUBJECT,
    ImageFactory,
    KeyPair,
    MockSigstore,
    cosign,
    make_token,
    mock_sigstore,
)
from tests.signing.images import PushedImage
from tests.signing.tamper import list_around, list_referrers, push_lookalikes

pytestmark = [pytest.mark.cosign, pytest.mark.registry]

INSECURE = "--allow-insecure-registry"


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"cosign failed:\n{result.stderr}"
    return result.stdout


def attested_predicates(stdout: str) -> list[dict[str, Any]]:
    """Predicates from `cosign verify-attestation` output (one DSSE envelope per line)."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            statement = json.loads(base64.b64decode(json.loads(line)["payload"]))
            out.append(statement["predicate"])
    return out


# -- cosign verifies what kernelbake signs --------------------------------------------------


def test_cosign3_verifies_kernelbake_bundles(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, other_keys: KeyPair, cosign3: str
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    pub = str(keys.public_path)
    common = ["--key", pub, "--insecure-ignore-tlog", "--new-bundle-format", INSECURE]
    out = ok(cosign(cosign3, "verify", *common, image.pinned))
    assert image.digest in out
    out = ok(cosign(cosign3, "verify-attestation", *common, "--type", PREDICATE_TYPE, image.pinned))
    (predicate,) = attested_predicates(out)
    assert predicate["key"] == str(image.key)
    # The check can fail: another key is refused.
    other = ["--key", str(other_keys.public_path), "--insecure-ignore-tlog", "--new-bundle-format", INSECURE]
    assert cosign(cosign3, "verify", *other, image.pinned).returncode != 0


def test_cosign2_verifies_kernelbake_legacy_tags(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, other_keys: KeyPair, cosign2: str
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client, legacy=True)
    common = ["--key", str(keys.public_path), "--insecure-ignore-tlog", INSECURE]
    out = ok(cosign(cosign2, "verify", *common, image.pinned))
    assert image.digest in out
    out = ok(cosign(cosign2, "verify-attestation", *common, "--type", PREDICATE_TYPE, image.pinned))
    (predicate,) = attested_predicates(out)
    assert predicate["cacheManifest"]["layerDigest"].startswith("sha256:")
    other = ["--key", str(other_keys.public_path), "--insecure-ignore-tlog", INSECURE]
    assert cosign(cosign2, "verify", *other, image.pinned).returncode != 0


def _pem(kind: str, b64: str) -> str:
    return f"-----BEGIN {kind}-----\n" + "\n".join(textwrap.wrap(b64, 64)) + f"\n-----END {kind}-----\n"


def _cosign2_trust_env(trusted_root: Path, workdir: Path) -> dict[str, str]:
    """cosign 2's legacy verifier takes the Fulcio root, Rekor and CT keys from files."""
    root = json.loads(trusted_root.read_text())
    files = {
        "SIGSTORE_ROOT_FILE": (
            "fulcio.pem",
            _pem(
                "CERTIFICATE", root["certificateAuthorities"][0]["certChain"]["certificates"][0]["rawBytes"]
            ),
        ),
        "SIGSTORE_REKOR_PUBLIC_KEY": (
            "rekor.pub",
            _pem("PUBLIC KEY", root["tlogs"][0]["publicKey"]["rawBytes"]),
        ),
        "SIGSTORE_CT_LOG_PUBLIC_KEY_FILE": (
            "ctlog.pub",
            _pem("PUBLIC KEY", root["ctlogs"][0]["publicKey"]["rawBytes"]),
        ),
    }
    env = {}
    for var, (name, text) in files.items():
        (workdir / name).write_text(text)
        env[var] = str(workdir / name)
    return env


@pytest.mark.sigstore
def test_cosign_verifies_kernelbake_keyless_both_formats(
    make_image: ImageFactory,
    client: RegistryClient,
    sigstore_mock: MockSigstore,
    cosign2: str,
    cosign3: str,
    tmp_path: Path,
) -> None:
    image = make_image()
    signer = KeylessSigner(load_trust_config(str(sigstore_mock.trust_config)), make_token())
    sign_image(image.tagged, signer, client=client, legacy=True)
    who = ["--certificate-identity", SUBJECT, "--certificate-oidc-issuer", ISSUER, INSECURE]
    bundle = ["--new-bundle-format", "--trusted-root", str(sigstore_mock.trusted_root), *who]
    ok(cosign(cosign3, "verify", *bundle, image.pinned))
    (predicate,) = attested_predicates(
        ok(cosign(cosign3, "verify-attestation", *bundle, "--type", PREDICATE_TYPE, image.pinned))
    )
    assert predicate["keyDigest"] == image.key.digest
    env = _cosign2_trust_env(sigstore_mock.trusted_root, tmp_path)
    ok(cosign(cosign2, "verify", "--offline", *who, image.pinned, env=env))
    ok(
        cosign(
            cosign2, "verify-attestation", "--offline", "--type", PREDICATE_TYPE, *who, image.pinned, env=env
        )
    )
    wrong = ["--certificate-identity", "https://someone.else/", "--certificate-oidc-issuer", ISSUER, INSECURE]
    assert (
        cosign(
            cosign3,
            "verify",
            "--new-bundle-format",
            "--trusted-root",
            str(sigstore_mock.trusted_root),
            *wrong,
            image.pinned,
        ).returncode
        != 0
    )


# -- kernelbake verifies what cosign signs --------------------------------------------------


@pytest.fixture(scope="module")
def cosign_keys(tmp_path_factory: pytest.TempPathFactory, cosign2: str) -> Path:
    """A key pair made by cosign itself (its encrypted private key format, empty password)."""
    d = tmp_path_factory.mktemp("cosign-keys")
    result = cosign(cosign2, "generate-key-pair", "--output-key-prefix", str(d / "cosign"))
    ok(result)
    return d


def _predicate_file(client: RegistryClient, image: PushedImage, workdir: Path) -> Path:
    """The kernelbake predicate for ``image``, for `cosign attest --predicate`."""
    top = client.get_manifest(image.ref.with_digest(image.digest))
    facts = read_image(client, image.ref.with_digest(image.digest), top)
    layer, data = read_cache_manifest(client, facts)
    path = workdir / "predicate.json"
    path.write_text(json.dumps(predicate_for(facts, layer.digest, data).to_json()))
    return path


def _cosign_sign_and_attest(
    binary: str,
    flags: list[str],
    client: RegistryClient,
    image: PushedImage,
    workdir: Path,
    env: dict[str, str] | None = None,
) -> None:
    """What a cosign user does: sign the digest, then attest kernelbake's predicate."""
    ok(cosign(binary, "sign", *flags, image.pinned, env=env))
    predicate = str(_predicate_file(client, image, workdir))
    ok(
        cosign(
            binary,
            "attest",
            *flags,
            "--type",
            PREDICATE_TYPE,
            "--predicate",
            predicate,
            image.pinned,
            env=env,
        )
    )


def _key_policy(cosign_keys: Path) -> VerifyPolicy:
    return VerifyPolicy.from_mapping({"keys": [str(cosign_keys / "cosign.pub")]}, source="cosign-key-policy")


def test_kernelbake_verifies_cosign2_legacy(
    make_image: ImageFactory,
    client: RegistryClient,
    cosign2: str,
    cosign_keys: Path,
    tmp_path: Path,
    keys: KeyPair,
) -> None:
    image = make_image()
    key = ["--key", str(cosign_keys / "cosign.key"), "--tlog-upload=false", INSECURE]
    _cosign_sign_and_attest(cosign2, key, client, image, tmp_path)
    assert client.referrers(image.ref.with_digest(image.digest)) == []  # legacy tags only
    verified = verify_image(image.tagged, _key_policy(cosign_keys), client=client)
    assert verified.digest == image.digest and verified.key == image.key
    with pytest.raises(UntrustedSigner):
        verify_image(image.tagged, keys.policy(), client=client)


def test_kernelbake_verifies_cosign3_bundles(
    make_image: ImageFactory,
    client: RegistryClient,
    cosign3: str,
    cosign_keys: Path,
    tmp_path: Path,
    keys: KeyPair,
) -> None:
    image = make_image()
    key = [
        "--key",
        str(cosign_keys / "cosign.key"),
        "--use-signing-config=false",
        "--tlog-upload=false",
        "--new-bundle-format",
        INSECURE,
    ]
    _cosign_sign_and_attest(cosign3, key, client, image, tmp_path)
    ref = image.ref.with_digest(image.digest)
    assert len(client.referrers(ref)) == 2
    verified = verify_image(image.tagged, _key_policy(cosign_keys), client=client)
    assert verified.digest == image.digest and verified.key == image.key
    assert verified.attestation["keyDigest"] == image.key.digest
    with pytest.raises(UntrustedSigner):
        verify_image(image.tagged, keys.policy(), client=client)


@pytest.mark.sigstore
def test_kernelbake_verifies_cosign3_keyless_bundles(
    make_image: ImageFactory,
    client: RegistryClient,
    sigstore_mock: MockSigstore,
    cosign3: str,
    tmp_path: Path,
) -> None:
    image = make_image()
    config = json.loads(sigstore_mock.trust_config.read_text())
    signing_config = tmp_path / "signing_config.json"
    signing_config.write_text(json.dumps(config["signingConfig"]))
    token = tmp_path / "token"
    token.write_text(make_token())
    keyless = [
        "--new-bundle-format",
        "--signing-config", str(signing_config),
        "--trusted-root", str(sigstore_mock.trusted_root),
        "--identity-token", str(token),
        INSECURE,
    ]  # fmt: skip
    _cosign_sign_and_attest(cosign3, keyless, client, image, tmp_path)
    policy = VerifyPolicy.from_mapping(
        {
            "identities": [{"issuer": ISSUER, "subject": SUBJECT}],
            "trusted_root": str(sigstore_mock.trusted_root),
        },
        source="keyless-policy",
    )
    verified = verify_image(image.tagged, policy, client=client)
    assert verified.signer == f"{SUBJECT} (issuer {ISSUER})"
    assert verified.key == image.key


@pytest.mark.sigstore
def test_kernelbake_verifies_cosign2_keyless_legacy(
    make_image: ImageFactory, client: RegistryClient, cosign2: str, tmp_path: Path
) -> None:
    image = make_image()
    with mock_sigstore(tmp_path / "sigstore") as server:
        env = _cosign2_trust_env(server.trusted_root, tmp_path)
        token = tmp_path / "token"
        token.write_text(make_token())
        keyless = [
            "--fulcio-url",
            server.url,
            "--rekor-url",
            server.url,
            "--identity-token",
            str(token),
            INSECURE,
        ]
        _cosign_sign_and_attest(cosign2, keyless, client, image, tmp_path, env=env)
    assert client.referrers(image.ref.with_digest(image.digest)) == []  # legacy tags only
    policy = VerifyPolicy.from_mapping(
        {"identities": [{"issuer": ISSUER, "subject": SUBJECT}], "trusted_root": str(server.trusted_root)},
        source="keyless-policy",
    )
    verified = verify_image(image.tagged, policy, client=client)  # offline: the server is gone
    assert verified.signer == f"{SUBJECT} (issuer {ISSUER})"
    assert verified.attestation["keyDigest"] == image.key.digest


# -- cosign 3's bundles next to junk, on a registry without the referrers API ----------------
# cosign 3 lists its bundles in the fallback index under the empty config's artifactType, with
# no annotations; junk may copy any of that. What is fetched depends on the listed artifactType
# and the position only: junk of another artifactType, in any number and order, hides nothing,
# nor does junk appended after cosign last wrote the index (cosign writes it in digest order);
# more than MAX_BUNDLES / 2 of cosign's own shape on both sides of it do (the bound, named in
# the failure).


def _predicate_annotated(i: int) -> dict[str, str]:
    return {formats.ANN_BUNDLE_PREDICATE: intoto.COSIGN_SIGN_PREDICATE, "junk": str(i)}


def _cosign_shaped(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Listed as cosign 3 lists its own: the empty config's artifactType, no annotations.
    return [
        {**{k: v for k, v in e.items() if k != "annotations"}, "artifactType": mt.OCI_EMPTY} for e in entries
    ]


COSIGN_JUNK = {
    # The report: 31 of these appended after cosign's two pushed both out (30 still verified).
    "31-predicate-annotated-bundles-after": (0, 31, False),
    "200-predicate-annotated-bundles-before-and-after": (200, 200, False),
    "200-cosign-shaped-after": (0, 200, True),
    # cosign sorts what it finds with its own two: all 16 are the oldest.
    "14-cosign-shaped-before-200-after": (discover.MAX_BUNDLES // 2 - 2, 200, True),
}


@pytest.mark.parametrize("kind", list(COSIGN_JUNK))
def test_no_junk_of_another_shape_or_appended_later_hides_cosign3_bundles(
    make_image: ImageFactory,
    client: RegistryClient,
    cosign3: str,
    cosign_keys: Path,
    tmp_path: Path,
    kind: str,
) -> None:
    image = make_image()
    flags = ["--key", str(cosign_keys / "cosign.key"), "--use-signing-config=false", "--tlog-upload=false"]
    before_n, after_n, shaped = COSIGN_JUNK[kind]
    shape = _cosign_shaped if shaped else list
    if before_n:
        list_referrers(client, image, shape(push_lookalikes(client, image, before_n, _predicate_annotated)))
    _cosign_sign_and_attest(cosign3, [*flags, "--new-bundle-format", INSECURE], client, image, tmp_path)
    listed = client.referrers(image.ref.with_digest(image.digest))
    # cosign added its two as the empty config's type (and wrote the index in digest order).
    assert len(listed) == before_n + 2
    assert sum(d.artifact_type == mt.OCI_EMPTY for d in listed) == 2 + before_n * shaped
    after = push_lookalikes(client, image, after_n, lambda i: _predicate_annotated(1000 + i))
    list_referrers(client, image, shape(after), first=False)
    verified = verify_image(image.tagged, _key_policy(cosign_keys), client=RegistryClient(client.settings))
    assert verified.digest == image.digest and verified.attestation["keyDigest"] == image.key.digest


def test_cosign_shaped_junk_both_before_and_after_the_signing_hides_it_and_says_the_bound(
    make_image: ImageFactory, client: RegistryClient, cosign3: str, cosign_keys: Path, tmp_path: Path
) -> None:
    # Where the guarantee ends: whoever may rewrite the fallback tag lists half the bound of
    # cosign's own shape before its two, and more after them.
    image = make_image()
    flags = ["--key", str(cosign_keys / "cosign.key"), "--use-signing-config=false", "--tlog-upload=false"]
    _cosign_sign_and_attest(cosign3, [*flags, "--new-bundle-format", INSECURE], client, image, tmp_path)
    before = _cosign_shaped(push_lookalikes(client, image, discover.MAX_BUNDLES // 2, _predicate_annotated))
    after = _cosign_shaped(push_lookalikes(client, image, 40, lambda i: _predicate_annotated(1000 + i)))
    list_around(client, image, before, after)
    with pytest.raises(VerificationFailed) as failed:
        verify_image(image.tagged, _key_policy(cosign_keys), client=RegistryClient(client.settings))
    assert f"not examined: only {discover.MAX_BUNDLES} candidate bundles are" in str(failed.value)
