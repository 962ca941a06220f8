"""``verify_signature`` and ``verify_index`` against the in-memory registry: a signed GPU index
and its variants verify; an unsigned index, an unsigned variant and an index whose key
annotation lies about a variant each fail, naming the part."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from kernelbake.contract.variants import OCI_INDEX, encode
from kernelbake.fleet import FleetIndex, read_index
from kernelbake.oci import Reference, RegistryClient, parse_reference
from kernelbake.plan import plan
from kernelbake.publish.index import publish_index
from kernelbake.signing.errors import LabelMismatch, Unsigned
from kernelbake.signing.index import verify_index
from kernelbake.signing.sign import sign_image
from kernelbake.signing.verify import verify_signature
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.signing.conftest import KeyPair
from tests.signing.images import PushedImage, push_image

GPUS = ("h100", "h200")


@pytest.fixture(scope="session")
def image_registry(memory_registry: str) -> str:
    return memory_registry


@pytest.fixture
def fleet(
    image_registry: str, client: RegistryClient, tmp_path: Path
) -> tuple[FleetIndex, dict[str, PushedImage]]:
    """An index of h100 and h200 variants (not signed yet)."""
    repo = f"{image_registry}/kb/fleet-{uuid.uuid4().hex[:8]}"
    targets = {
        t.gpu.name: t for t in plan(load_spec(REPO / "images" / "qwen3-0.6b.yaml"), list(GPUS), registry="r")
    }
    variants = {
        gpu: push_image(client, f"{repo}:{gpu}", tmp_path / gpu, target=targets[gpu], salt=gpu)
        for gpu in GPUS
    }
    index = read_index(publish_index([v.pinned for v in variants.values()], client=client), client=client)
    assert index is not None
    return index, variants


def test_a_signed_index_and_its_signed_variants_verify(
    fleet: tuple[FleetIndex, dict[str, PushedImage]], client: RegistryClient, keys: KeyPair
) -> None:
    index, variants = fleet
    for v in variants.values():
        sign_image(v.pinned, keys.signer, client=client)
    sign_image(index.ref.pinned(), keys.signer, client=client, attest=False)
    done = verify_index(index, keys.policy(), client)
    assert done.ok and done.failures == ()
    assert done.signature is not None and done.signature.digest == index.ref.digest
    assert done.signature.signer == f"key {keys.public.fingerprint}"
    assert {r.variant.digest: r.verified.key for r in done.variants if r.verified} == {
        v.digest: v.key for v in variants.values()
    }


def test_each_unsigned_part_fails_on_its_own(
    fleet: tuple[FleetIndex, dict[str, PushedImage]], client: RegistryClient, keys: KeyPair
) -> None:
    index, variants = fleet
    with pytest.raises(Unsigned, match="no signature found"):
        verify_signature(client, index.ref, keys.policy())
    sign_image(variants["h100"].pinned, keys.signer, client=client)
    done = verify_index(index, keys.policy(), client)
    assert isinstance(done.signature_failure, Unsigned)
    by_gpu = {r.variant.key.device: r for r in done.variants}
    assert by_gpu["NVIDIA H100 80GB HBM3"].failure is None
    assert isinstance(by_gpu["NVIDIA H200"].failure, Unsigned)
    # The index's own failure first.
    assert done.failures[0] is done.signature_failure and len(done.failures) == 2


def test_an_index_that_lies_about_a_variants_key_fails_naming_it(
    fleet: tuple[FleetIndex, dict[str, PushedImage]], client: RegistryClient, keys: KeyPair
) -> None:
    index, variants = fleet
    for v in variants.values():
        sign_image(v.pinned, keys.signer, client=client)
    doc = json.loads(json.dumps(client.get_manifest(index.ref).doc))
    first, second = doc["manifests"]
    first["annotations"], second["annotations"] = second["annotations"], first["annotations"]
    ref = Reference(index.ref.registry, index.ref.repository, tag="swapped")
    pushed = client.put_manifest(ref, encode(doc), OCI_INDEX)
    # Signed by the same key: the signature alone does not make the list right.
    sign_image(ref.with_digest(pushed.digest).pinned(), keys.signer, client=client, attest=False)
    lying = read_index(parse_reference(f"{ref.name}@{pushed.digest}").pinned(), client=client)
    assert lying is not None
    done = verify_index(lying, keys.policy(), client)
    assert done.signature_failure is None
    assert [type(f) for f in done.failures] == [LabelMismatch, LabelMismatch]
    h100 = next(r for r in done.variants if r.variant.digest == variants["h100"].digest)
    assert f"claims key {variants['h200'].key.digest} (NVIDIA H200)" in str(h100.failure)
    assert f"verifies as {variants['h100'].key.digest}" in str(h100.failure)
