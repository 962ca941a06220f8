"""JSON nested 200,000 deep from the registry (issue 41 item 6): an OCI manifest where a delta is
named, a referrers listing, a bundle among the referrers. Each is refused as what it is (not
JSON nested this deep) with one line, or passed over as junk; none ends in a RecursionError."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.contract.delta import DELTA_MANIFEST, DeltaFile, DeltaManifest, Origin, Rebuild
from kernelbake.contract.jsondoc import MAX_JSON_DEPTH
from kernelbake.contract.layout import CacheKind
from kernelbake.errors import KernelbakeError
from kernelbake.oci import RegistryClient, parse_reference
from kernelbake.oci import types as mt
from kernelbake.oci.client import fallback_tag
from kernelbake.signing.delta import push_delta, verify_delta
from kernelbake.signing.sign import sign_image
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import PushedImage
from tests.signing.tamper import list_around, push_referrer

DEEP = b"[" * 200_000 + b"]" * 200_000
WHY = f"JSON nested 200,000 levels deep, more than the {MAX_JSON_DEPTH} allowed"


@pytest.fixture(scope="module")
def image_registry(memory_registry: str) -> str:
    return memory_registry


def _delta_dir(tmp_path: Path, base: PushedImage) -> Path:
    out = tmp_path / "delta"
    data = b"cubin"
    (out / "triton" / "tk1").mkdir(parents=True)
    (out / "triton" / "tk1" / "kernel.cubin").write_bytes(data)
    entry = DeltaFile(
        path="triton/tk1/kernel.cubin",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        kind=CacheKind.TRITON,
    )
    delta = DeltaManifest(
        key=base.key,
        base_image=None,
        base_manifest=mt.sha256_digest(base.cache_manifest),
        files=(entry,),
        replica="r0",
        # What a trusted rebuild writes: the default policy refuses a replica's own bytes.
        origin=Origin.REBUILT,
        rebuild=Rebuild(builder="builder-1", image=base.digest, record="sha256:" + "e" * 64),
    )
    (out / DELTA_MANIFEST).write_text(delta.to_json())
    return out


def test_capture_verify_of_a_deep_manifest_is_one_line(
    client: RegistryClient,
    make_image: ImageFactory,
    keys: KeyPair,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = make_image()
    deep = parse_reference(f"{base.ref.registry}/{base.ref.repository}:deep-delta")
    client.put_manifest(deep, DEEP, mt.OCI_MANIFEST)
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"keys: [{keys.public_path}]\n")
    code = main(["capture", "verify", str(deep), "--base", base.pinned, "--policy", str(policy)])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith("kernelbake capture: error: ") and WHY in line


def test_a_deep_bundle_among_the_referrers_is_junk_and_the_signature_still_verifies(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base = make_image()
    pushed = push_delta(_delta_dir(tmp_path, base), base=base.pinned, signer=keys.signer, client=client)
    ref = parse_reference(pushed.reference)
    delta = PushedImage(
        ref=ref.with_tag("delta"), digest=str(ref.digest), key=base.key, labels={}, cache_manifest=b""
    )
    list_around(client, delta, [push_referrer(client, delta, DEEP)], [])
    verified = verify_delta(pushed.reference, base=base.pinned, policy=keys.policy(), client=client)
    assert verified.skipped, "the deep bundle is passed over with a note"


def test_a_deep_fallback_index_fails_closed_naming_it(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.pinned, keys.signer, client=client, attest=False)
    at = image.ref.with_digest(image.digest)
    client.put_manifest(at.with_tag(fallback_tag(image.digest)), DEEP, mt.OCI_INDEX)
    with pytest.raises(KernelbakeError, match=f"fallback tag .*: {WHY}"):
        verify_image(image.pinned, keys.policy(), client=client)
