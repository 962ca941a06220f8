"""Key-based signing and verification, both formats, against the in-memory registry (which,
like Debian's docker-registry, has no referrers API). The real registry is exercised by
tests/oci, the cosign interop and the admission integration tests."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.errors import BadInput
from kernelbake.oci import RegistryClient, fallback_tag, parse_reference
from kernelbake.oci import types as mt
from kernelbake.settings import Settings
from kernelbake.signing import formats, intoto
from kernelbake.signing.errors import Unsigned
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.predicate import PREDICATE_TYPE
from kernelbake.signing.sign import sign_image
from kernelbake.signing.verify import VerifiedImage, verify_image
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import push_image
from tests.support.memregistry import memory_registry


@pytest.fixture(scope="session")
def image_registry(memory_registry: str) -> str:
    return memory_registry


def test_sign_then_verify_by_tag_digest_and_both(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()
    result = sign_image(image.tagged, keys.signer, client=client)
    assert result.digest == image.digest
    assert result.signer == f"key {keys.public.fingerprint}"
    assert len(result.referrers) == 2 and result.legacy_tags == ()

    for ref in (image.tagged, image.pinned, f"{image.tagged}@{image.digest}"):
        verified = verify_image(ref, keys.policy(), client=client)
        assert isinstance(verified, VerifiedImage)
        assert verified.reference == ref
        assert verified.repository == image.ref.name
        assert verified.digest == image.digest
        assert verified.key == image.key
        assert verified.manifest_digest == mt.sha256_digest(image.cache_manifest)
        assert verified.signer == f"key {keys.public.fingerprint}"
        assert verified.attestation["key"] == str(image.key)
        assert verified.attestation["builder"] == "cpu"


def test_signatures_are_stored_as_referrers_through_the_fallback_tag(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    ref = image.ref.with_digest(image.digest)
    # Debian's docker-registry has no referrers API: the fallback index is what lists them.
    index = client.get_manifest(ref.with_tag(fallback_tag(image.digest)))
    assert index.media_type == mt.OCI_INDEX
    referrers = client.referrers(ref)
    assert [d.digest for d in referrers] == [d.digest for d in index.manifests]
    predicate_types = set()
    for desc in referrers:
        manifest = client.get_manifest(ref.with_digest(desc.digest))
        assert manifest.artifact_type == formats.BUNDLE_V03
        assert manifest.subject is not None and manifest.subject.digest == image.digest
        bundle = json.loads(client.get_blob(ref, manifest.layers[0].digest))
        assert bundle["verificationMaterial"] == {"publicKey": {"hint": keys.public.hint}}
        statement = intoto.parse_statement(base64.b64decode(bundle["dsseEnvelope"]["payload"]), source="t")
        assert statement.covers(image.digest)
        predicate_types.add(statement.predicate_type)
        assert manifest.annotations[formats.ANN_BUNDLE_PREDICATE] == statement.predicate_type
    assert predicate_types == {intoto.COSIGN_SIGN_PREDICATE, PREDICATE_TYPE}


def test_a_registry_with_the_referrers_api_gets_no_fallback_tag(
    settings: Settings, keys: KeyPair, tmp_path: Path
) -> None:
    with memory_registry(referrers_api=True) as (addr, store):
        client = RegistryClient(settings)
        image = push_image(client, f"{addr}/kb/referrers:v1", tmp_path / "img")
        sign_image(image.tagged, keys.signer, client=client)
        assert (image.ref.repository, fallback_tag(image.digest)) not in store.tags
        assert len(client.referrers(image.ref.with_digest(image.digest))) == 2  # signature + attestation
        assert verify_image(image.tagged, keys.policy(), client=client).digest == image.digest


def test_manifests_keep_their_exact_bytes(image_registry: str, client: RegistryClient) -> None:
    ref = parse_reference(f"{image_registry}/kb/raw-bytes:odd")
    config = b'{"config":{}}'
    client.put_blob(ref, config)
    # Whitespace and key order that a re-serializer would change.
    data = (
        f'{{\n  "schemaVersion": 2,   "mediaType": "{mt.OCI_MANIFEST}",\n "layers": [],\n'
        f'  "config": {{"size": {len(config)}, "digest": "{mt.sha256_digest(config)}", '
        f'"mediaType": "{mt.OCI_CONFIG}"}}\n}}\n'
    ).encode()
    pushed = client.put_manifest(ref, data, mt.OCI_MANIFEST)
    assert pushed.digest == mt.sha256_digest(data)
    by_tag = client.get_manifest(ref)
    by_digest = client.get_manifest(ref.with_digest(pushed.digest))
    assert by_tag.data == by_digest.data == data
    assert client.resolve(ref) == pushed.digest


def test_legacy_only_image_verifies(make_image: ImageFactory, client: RegistryClient, keys: KeyPair) -> None:
    image = make_image()
    result = sign_image(image.tagged, keys.signer, client=client, legacy=True)
    assert result.legacy_tags == (
        formats.legacy_tag(image.digest, ".sig"),
        formats.legacy_tag(image.digest, ".att"),
    )
    # Remove the bundle referrers: only cosign 2's tags remain.
    ref = image.ref.with_digest(image.digest)
    empty_index = mt.encode_json({"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": []})
    client.put_manifest(ref.with_tag(fallback_tag(image.digest)), empty_index, mt.OCI_INDEX)
    assert client.referrers(ref) == []
    verified = verify_image(image.pinned, keys.policy(), client=client)
    assert verified.signer == f"key {keys.public.fingerprint}"
    assert verified.manifest_digest == mt.sha256_digest(image.cache_manifest)


def test_signing_twice_appends(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, other_keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, other_keys.signer, client=client, legacy=True)
    sign_image(image.tagged, keys.signer, client=client, legacy=True)
    ref = image.ref.with_digest(image.digest)
    assert len(client.referrers(ref)) == 4
    sig = client.get_manifest(ref.with_tag(formats.legacy_tag(image.digest, ".sig")))
    assert len(sig.layers) == 2
    # Either signer alone is enough for a policy trusting only that signer.
    assert verify_image(image.pinned, keys.policy(), client=client).signer.endswith(keys.public.fingerprint)
    assert verify_image(image.pinned, other_keys.policy(), client=client).signer.endswith(
        other_keys.public.fingerprint
    )


def test_without_attestation_requirement(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client, attest=False)
    verified = verify_image(image.tagged, keys.policy(require_attestation=False), client=client)
    assert verified.attestation == {}
    assert verified.key == image.key
    assert verified.manifest_digest == mt.sha256_digest(image.cache_manifest)


def test_unsigned_is_refused_not_verified(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()
    with pytest.raises(Unsigned, match=image.digest):
        verify_image(image.tagged, keys.policy(), client=client)


def test_cli_generate_sign_verify(
    make_image: ImageFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.delenv("KERNELBAKE_SIGNING_KEY_PASSWORD", raising=False)
    monkeypatch.delenv("COSIGN_PASSWORD", raising=False)
    image = make_image()
    assert main(["generate-key-pair", "--dir", str(tmp_path / "k")]) == 0
    out = capsys.readouterr().out
    assert "fingerprint: sha256:" in out
    assert main(["sign", "--key", str(tmp_path / "k/kernelbake.key"), "--legacy", image.tagged]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"signed and attested {image.pinned} by key sha256:")
    assert main(["verify", image.tagged, "--key", str(tmp_path / "k/kernelbake.pub")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"verified {image.pinned}: signed by key sha256:")
    policy = tmp_path / "policy.yaml"
    policy.write_text("verify:\n  keys: [k/kernelbake.pub]\n")
    assert main(["verify", image.pinned, "--policy", str(policy), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verified"] is True and doc["digest"] == image.digest
    assert doc["key_digest"] == image.key.digest
    assert doc["attestation"]["cacheManifest"]["digest"] == mt.sha256_digest(image.cache_manifest)


def test_make_image_default_key_is_generated_once_and_used(
    make_image: ImageFactory, client: RegistryClient, tmp_path: Path
) -> None:
    from kernelbake.settings import Settings
    from kernelbake.signing.keys import generate_key_pair, load_public_key_file
    from kernelbake.signing.signer import local_key_path, signer_from_settings

    settings = Settings(build_dir=tmp_path / "build", docker_config=tmp_path / "docker")
    with pytest.raises(BadInput, match=r"kernelbake\.key: cannot read signing key: No such file"):
        signer_from_settings(settings)
    key = local_key_path(settings)
    assert key == tmp_path / "build/signing/kernelbake.key"
    # What `make signing-key` does: `kernelbake generate-key-pair --dir build/signing`.
    assert generate_key_pair(key.parent)[0] == key and key.stat().st_mode & 0o777 == 0o600
    image = make_image()
    sign_image(image.tagged, signer_from_settings(settings), client=client)
    pub = load_public_key_file(key.with_suffix(".pub"))
    policy = VerifyPolicy.from_mapping({"keys": [pub.pem().decode()]}, source="inline")
    assert verify_image(image.tagged, policy, client=client).signer == f"key {pub.fingerprint}"
