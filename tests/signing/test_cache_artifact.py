"""Cache-only artifacts (contract.artifact) sign and verify like images: the manifest is read
at the artifact's root, its labels (engine image, manifest digest, command, env) are attested
and checked, and an image cannot pass for an artifact nor the other way round."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbake.contract.artifact import LABEL_ARTIFACT, LABEL_COMMAND, CacheArtifactFacts, EngineImage
from kernelbake.contract.layout import MANIFEST
from kernelbake.errors import BadInput
from kernelbake.oci import RegistryClient
from kernelbake.oci import types as mt
from kernelbake.remote import inspect_remote
from kernelbake.signing.errors import CacheManifestMismatch, LabelMismatch
from kernelbake.signing.predicate import PREDICATE_TYPE
from kernelbake.signing.sign import sign_image
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import KeyPair
from tests.signing.images import PushedImage, push_image, tiny_llama_target

ENGINE = EngineImage(
    name="example.com/vllm/vllm-cpu:0.32.0", config_digest="sha256:" + "c" * 64, digest="sha256:" + "d" * 64
)


@pytest.fixture(scope="session")
def image_registry(memory_registry: str) -> str:
    return memory_registry


def facts(
    manifest_digest: str, command: tuple[str, ...] = ("python3", "-m", "vllm.entrypoints.openai.api_server")
) -> CacheArtifactFacts:
    return CacheArtifactFacts(
        engine=ENGINE,
        manifest_digest=manifest_digest,
        command=command,
        env=(("TORCHINDUCTOR_CACHE_DIR", "/opt/kernelbake/cache/inductor"),),
    )


def push_artifact(
    client: RegistryClient,
    registry: str,
    workdir: Path,
    name: str,
    *,
    labels: dict[str, str] | None = None,
    manifest_digest: str | None = None,
) -> PushedImage:
    """Push once to learn the manifest's digest (it depends only on the files and key), then
    push the artifact labelled with it."""
    target = tiny_llama_target()
    probe = push_image(
        client,
        f"{registry}/{name}:probe",
        workdir / "probe",
        root_dir="",
        manifest_path=MANIFEST,
        target=target,
    )
    digest = manifest_digest or mt.sha256_digest(probe.cache_manifest)
    all_labels = {**dict(target.labels), **facts(digest).labels(), **(labels or {})}
    return push_image(
        client,
        f"{registry}/{name}:v1-cache",
        workdir / "art",
        root_dir="",
        manifest_path=MANIFEST,
        labels=all_labels,
        target=target,
    )


def test_a_cache_artifact_signs_and_verifies_with_its_labels_attested(
    client: RegistryClient, image_registry: str, keys: KeyPair, tmp_path: Path
) -> None:
    art = push_artifact(client, image_registry, tmp_path, "kb/art-ok")
    result = sign_image(art.tagged, keys.signer, client=client)
    assert result.predicate is not None and result.predicate.cache_manifest_path == MANIFEST
    verified = verify_image(art.pinned, keys.policy(require_attestation=True), client=client)
    assert verified.artifact == facts(mt.sha256_digest(art.cache_manifest))
    assert verified.manifest_digest == mt.sha256_digest(art.cache_manifest)
    assert verified.attestation["cacheManifest"]["path"] == "/manifest.json"
    assert verified.attestation["cacheArtifact"]["engineImage"]["digest"] == ENGINE.digest
    shown = inspect_remote(art.pinned, client=client)
    assert shown.cache_manifest is not None and shown.cache_manifest.key == art.key


def test_an_artifact_whose_manifest_label_is_not_its_manifest_is_refused_at_sign_and_verify(
    client: RegistryClient, image_registry: str, keys: KeyPair, tmp_path: Path
) -> None:
    art = push_artifact(
        client, image_registry, tmp_path, "kb/art-bad-digest", manifest_digest="sha256:" + "e" * 64
    )
    with pytest.raises(BadInput, match="label says cache manifest"):
        sign_image(art.tagged, keys.signer, client=client)
    sign_image(art.tagged, keys.signer, client=client, attest=False)
    with pytest.raises(CacheManifestMismatch, match="artifact's label says"):
        verify_image(art.pinned, keys.policy(require_attestation=False), client=client)


def test_an_image_labelled_as_an_artifact_is_not_read_at_the_wrong_path(
    client: RegistryClient, image_registry: str, keys: KeyPair, tmp_path: Path
) -> None:
    # Image layout (manifest under /opt/kernelbake/cache) with the artifact label: the
    # manifest is looked for at the root, so it is not found and nothing is signed.
    target = tiny_llama_target()
    labels = {**dict(target.labels), **facts("sha256:" + "e" * 64).labels()}
    img = push_image(client, f"{image_registry}/kb/mislabelled:v1", tmp_path, labels=labels)
    with pytest.raises(BadInput, match=r"it must hold only manifest\.json"):
        sign_image(img.tagged, keys.signer, client=client)


def test_an_attestation_of_other_artifact_labels_does_not_verify(
    client: RegistryClient, image_registry: str, keys: KeyPair, tmp_path: Path
) -> None:
    # Same files and key, another command: the first artifact's attestation, copied onto the
    # second's digest by a signer, must not vouch for the second's labels.
    art = push_artifact(client, image_registry, tmp_path / "a", "kb/art-cmd")
    result = sign_image(art.tagged, keys.signer, client=client)
    assert result.predicate is not None
    other = push_artifact(
        client,
        image_registry,
        tmp_path / "b",
        "kb/art-cmd2",
        labels={LABEL_COMMAND: '["python3","-m","evil"]'},
    )
    from kernelbake.oci import parse_reference
    from kernelbake.signing import intoto
    from kernelbake.signing.sign import push_bundle

    ref = parse_reference(other.pinned)
    top = client.get_manifest(ref)
    signed = keys.signer.sign_statement(
        intoto.make_statement(ref.name, top.digest, intoto.COSIGN_SIGN_PREDICATE, {})
    )
    push_bundle(client, ref, top.descriptor(), signed.bundle, intoto.COSIGN_SIGN_PREDICATE, keys.signer)
    stale = keys.signer.sign_statement(
        intoto.make_statement(ref.name, top.digest, PREDICATE_TYPE, result.predicate.to_json())
    )
    push_bundle(client, ref, top.descriptor(), stale.bundle, PREDICATE_TYPE, keys.signer)
    with pytest.raises(LabelMismatch, match="cache artifact labels differ"):
        verify_image(other.pinned, keys.policy(require_attestation=True), client=client)
    assert LABEL_ARTIFACT in other.labels
