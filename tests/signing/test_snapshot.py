"""A snapshot pushed as a referrer of the image it was taken from, signed and attested, and
verified as admission does: only a snapshot whose signature the policy trusts, whose subject and
key name the pod's image and its cache key passes; nothing is pushed from a directory whose files
are not what snapshot.json says, nor for an image the snapshot was not taken from."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from kernelbake.contract.snapshot import ARTIFACT_TYPE, SNAPSHOT_MANIFEST, SnapshotFile, SnapshotManifest
from kernelbake.errors import BadInput
from kernelbake.oci import RegistryClient, parse_reference
from kernelbake.signing.errors import SnapshotRefused, VerificationFailed
from kernelbake.signing.snapshot import push_snapshot, read_snapshot, verify_snapshot
from tests.contract.test_snapshot import cpu_key
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import PushedImage

FILES = {
    "images/pages-1.img": b"\x00pages" * 100,
    "images/core-7.img": b"core",
    "images/engine.log": b"log\n",
}


@pytest.fixture(scope="module")
def image_registry(memory_registry: str) -> str:
    return memory_registry


def _dir(tmp_path: Path, base: PushedImage, *, image: str | None = None) -> Path:
    out = tmp_path / "snap"
    for rel, data in FILES.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    manifest = SnapshotManifest(
        key=cpu_key(image=image or base.digest, cache_key=base.key),
        files=tuple(
            SnapshotFile(path=p, size=len(d), sha256=hashlib.sha256(d).hexdigest()) for p, d in FILES.items()
        ),
        tree=((1001, "python3 -m kernelbake serve"),),
        health_port=8000,
        health_path="/health",
        deadline_s=30.0,
    )
    (out / SNAPSHOT_MANIFEST).write_text(manifest.to_json())
    return out


def test_a_pushed_snapshot_is_a_signed_referrer_of_its_image_and_verifies(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base = make_image()
    pushed = push_snapshot(_dir(tmp_path, base), base=base.pinned, signer=keys.signer, client=client)
    ref = parse_reference(pushed.reference)
    top = client.get_manifest(ref)
    assert (
        top.artifact_type == ARTIFACT_TYPE and top.subject is not None and top.subject.digest == base.digest
    )
    assert pushed.reference in {
        f"{ref.name}@{d.digest}" for d in client.referrers(ref.with_digest(base.digest))
    }
    verified = verify_snapshot(pushed.reference, base=base.pinned, policy=keys.policy(), client=client)
    assert verified.manifest_digest == pushed.manifest_digest
    assert (
        verified.manifest_digest
        == "sha256:" + hashlib.sha256((tmp_path / "snap" / SNAPSHOT_MANIFEST).read_bytes()).hexdigest()
    )
    assert verified.files == 3 and verified.key.image == base.digest


def test_without_to_a_snapshot_is_tagged_beside_its_base(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    """``<tag>-snapshot`` beside a tagged base; ``snapshot-sha256-<hex>`` for one named by digest
    alone (build/image.ref), one tag per base digest, so two images of one repository keep a
    snapshot each."""
    base, other = make_image(), make_image()
    tagged = push_snapshot(
        _dir(tmp_path / "a", base), base=f"{base.tagged}@{base.digest}", signer=keys.signer, client=client
    )
    by_digest = [
        push_snapshot(_dir(tmp_path / n, b), base=b.pinned, signer=keys.signer, client=client)
        for n, b in (("b", base), ("c", other))
    ]
    assert base.ref.tag is not None
    for image, tag, pushed in (
        (base, f"{base.ref.tag}-snapshot", tagged),
        (base, "snapshot-" + base.digest.replace(":", "-"), by_digest[0]),
        (other, "snapshot-" + other.digest.replace(":", "-"), by_digest[1]),
    ):
        got = client.get_manifest(image.ref.with_tag(tag))
        assert f"{image.ref.name}@{got.digest}" == pushed.reference, tag


def test_another_key_or_another_image_is_refused(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, other_keys: KeyPair, tmp_path: Path
) -> None:
    base, other = make_image(), make_image()
    pushed = push_snapshot(_dir(tmp_path, base), base=base.pinned, signer=keys.signer, client=client)
    with pytest.raises(VerificationFailed):
        read_snapshot(client, pushed.reference, other_keys.policy())
    with pytest.raises(
        SnapshotRefused, match=f"refers to {base.digest}, but the pod's image is {other.digest}"
    ):
        verify_snapshot(pushed.reference, base=other.pinned, policy=keys.policy(), client=client)


def test_nothing_is_pushed_for_a_foreign_or_tampered_snapshot(
    client: RegistryClient, make_image: ImageFactory, keys: KeyPair, tmp_path: Path
) -> None:
    base, other = make_image(), make_image()
    with pytest.raises(SnapshotRefused, match=f"taken from image {other.digest}, not {base.digest}"):
        push_snapshot(
            _dir(tmp_path, base, image=other.digest), base=base.pinned, signer=keys.signer, client=client
        )
    assert client.referrers(parse_reference(base.pinned)) == []
    (tmp_path / "snap/images/pages-1.img").write_bytes(b"\x01pages" * 100)
    (tmp_path / "snap" / SNAPSHOT_MANIFEST).unlink()
    snap = _dir(tmp_path / "again", base)
    (snap / "images/pages-1.img").write_bytes(b"\x01pages" * 100)
    with pytest.raises(BadInput, match=r"pages-1\.img: sha256"):
        push_snapshot(snap, base=base.pinned, signer=keys.signer, client=client)
    (snap / "images/pages-1.img").write_bytes(FILES["images/pages-1.img"])
    (snap / "images/extra.img").write_bytes(b"x")
    with pytest.raises(BadInput, match=r"not listed in snapshot\.json"):
        push_snapshot(snap, base=base.pinned, signer=keys.signer, client=client)
    assert client.referrers(parse_reference(base.pinned)) == []


PARTS = {
    "images/weights/rank-0/index.json": b'{"schema": 1}',
    "images/weights/rank-0/part-0000.bin": b"\x01" * 3000,
    "images/weights/rank-0/part-0001.bin": b"\x02" * 2000,
}


def test_weights_beside_push_a_layer_a_part_and_verify(
    client: RegistryClient,
    make_image: ImageFactory,
    keys: KeyPair,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import io
    import tarfile

    from kernelbake.signing import snapshot as snapshot_mod

    base = make_image()
    criu_files = sorted(FILES)
    monkeypatch.setattr(sys.modules[__name__], "FILES", {**FILES, **PARTS})
    pushed = push_snapshot(_dir(tmp_path, base), base=base.pinned, signer=keys.signer, client=client)
    ref = parse_reference(pushed.reference)
    layers = client.get_manifest(ref).layers
    held = []
    for d in layers:
        with tarfile.open(fileobj=io.BytesIO(client.get_blob(ref, d.digest)), mode="r:") as tar:
            held.append(sorted(m.name for m in tar.getmembers() if m.isfile()))
    assert held == [
        [*criu_files, "images/weights/rank-0/index.json"],
        ["images/weights/rank-0/part-0000.bin"],
        ["images/weights/rank-0/part-0001.bin"],
        [SNAPSHOT_MANIFEST],
    ]
    verified = verify_snapshot(pushed.reference, base=base.pinned, policy=keys.policy(), client=client)
    assert verified.files == 6
    # More part files than layers a snapshot may have: refused before anything is pushed.
    monkeypatch.setattr(snapshot_mod, "MAX_WEIGHT_LAYERS", 1)
    with pytest.raises(BadInput, match="2 part files; a snapshot pushes at most 1"):
        push_snapshot(_dir(tmp_path / "again", base), base=base.pinned, signer=keys.signer, client=client)


def test_a_snapshot_artifact_with_more_layers_than_it_may_have_is_refused() -> None:
    from kernelbake.oci import Descriptor
    from kernelbake.oci import types as mt
    from kernelbake.signing import referrer
    from kernelbake.signing.snapshot import KIND

    def layers(n: int) -> list[Descriptor]:
        return [
            Descriptor(media_type=mt.OCI_LAYER_TAR, digest="sha256:" + f"{i:064x}", size=1) for i in range(n)
        ]

    assert referrer.manifest_descriptor("x", layers(2), KIND) == layers(2)[-1]
    assert referrer.manifest_descriptor("x", layers(KIND.max_layers), KIND).digest.endswith(
        f"{KIND.max_layers - 1:x}"
    )
    for n in (1, KIND.max_layers + 1):
        with pytest.raises(SnapshotRefused, match=f"has 2 to {KIND.max_layers} tar layers .*, not {n}"):
            referrer.manifest_descriptor("x", layers(n), KIND)
