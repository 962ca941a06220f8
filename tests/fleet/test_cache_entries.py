"""Cache artifacts in a model's variant index, pure: listed beside images with their kind,
never matched by a runtime as a platform, and picked apart from images by resolve and admission."""

from __future__ import annotations

import copy

import pytest

from kernelbake.admission.policy import GpuMatch
from kernelbake.admission.scheduling import ways
from kernelbake.admission.variants import pick
from kernelbake.catalogue import load_catalogue
from kernelbake.contract.artifact import LABEL_ARTIFACT, ArtifactKind
from kernelbake.contract.variants import InvalidIndex, Variant, index_document, variants_from_index
from kernelbake.fleet import FleetIndex, resolve
from kernelbake.gfd import PRODUCT
from kernelbake.oci import parse_reference
from tests.fleet.test_variants import planned


def entry(key_name: str, kind: ArtifactKind, n: int) -> Variant:
    return Variant(
        key=planned()[key_name],
        digest="sha256:" + f"{n:x}" * 64,
        size=100 + n,
        media_type="application/vnd.oci.image.manifest.v1+json",
        kind=kind,
    )


def test_an_image_and_its_cache_artifact_share_a_key_and_round_trip_with_their_kind() -> None:
    entries = [entry("h100", ArtifactKind.CACHE, 1), entry("h100", ArtifactKind.IMAGE, 2)]
    doc = index_document(entries)
    # Images first; the artifact's platform variant is one no runtime resolves.
    assert [m["platform"].get("variant") for m in doc["manifests"]] == [
        "kernelbake-sm_90a",
        "kernelbake-cache-sm_90a",
    ]
    assert doc["manifests"][1]["annotations"][LABEL_ARTIFACT] == "cache/v1"
    assert LABEL_ARTIFACT not in doc["manifests"][0]["annotations"]
    back = variants_from_index(doc, source="test")
    assert [v.kind for v in back] == [ArtifactKind.IMAGE, ArtifactKind.CACHE]
    with pytest.raises(InvalidIndex, match="same key"):
        index_document([*entries, entry("h100", ArtifactKind.CACHE, 3)])


def test_an_edited_kind_is_refused() -> None:
    doc = index_document([entry("h100", ArtifactKind.CACHE, 1)])
    bad = copy.deepcopy(doc)
    bad["manifests"][0]["annotations"][LABEL_ARTIFACT] = "rootfs"
    with pytest.raises(InvalidIndex, match="manifests\\[0\\]"):
        variants_from_index(bad, source="test")
    # Dropping the kind makes it an image whose platform no longer matches: refused too.
    bad["manifests"][0]["annotations"].pop(LABEL_ARTIFACT)
    with pytest.raises(InvalidIndex, match="platform"):
        variants_from_index(bad, source="test")


def test_resolve_and_admission_pick_each_kind_apart() -> None:
    entries = (
        entry("h100", ArtifactKind.IMAGE, 1),
        entry("h100", ArtifactKind.CACHE, 2),
        entry("h200", ArtifactKind.CACHE, 3),
    )
    index = FleetIndex(parse_reference("r.example/kb/m@sha256:" + "0" * 64), entries)
    found = {"device": planned()["h200"].device, "arch": planned()["h200"].arch}
    cache = resolve(index, found, ArtifactKind.CACHE)
    assert cache.best is not None and cache.variant(cache.best).digest == entries[2].digest
    image = resolve(index, found)
    # The only image is the H100's: same arch, not the H200 cache artifact.
    assert image.best is not None and image.variant(image.best).digest == entries[0].digest
    spec = {"nodeSelector": {PRODUCT: "NVIDIA-H200"}, "containers": [{"name": "c", "image": "x"}]}
    got = pick(entries, tuple(ways(spec)), load_catalogue(), GpuMatch.DEVICE)
    assert got.variant is None  # images only: the H200 has no image of its own
    got = pick(entries, tuple(ways(spec)), load_catalogue(), GpuMatch.DEVICE, ArtifactKind.CACHE)
    assert got.variant == entries[2]
