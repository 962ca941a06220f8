"""The variant index in the real docker-registry: published from pushed variants, resolved by
``kernelbake resolve`` for a GPU product, a node's labels and this machine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelbake.contract.variants import OCI_INDEX, variants_from_index
from kernelbake.fleet import read_index
from kernelbake.oci import RegistryClient, parse_reference
from kernelbake.publish.index import publish_index
from tests.admission import live
from tests.signing.images import PushedImage

pytestmark = pytest.mark.registry
REPOSITORY = "kernelbake/fleet"


@pytest.fixture(scope="module")
def variants(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PushedImage]]:
    tmp = tmp_path_factory.mktemp("fleet")
    yield {
        gpu: live.push_target(registry, REPOSITORY, gpu, gpu, tmp / gpu)
        for gpu in ("h100", "h200", "a100-80gb")
    }


@pytest.fixture(scope="module")
def index(variants: dict[str, PushedImage]) -> str:
    return publish_index([v.pinned for v in variants.values()])


def test_the_index_lists_every_variant_with_its_key(index: str, variants: dict[str, PushedImage]) -> None:
    ref = parse_reference(index)
    top = RegistryClient(timeout=30).get_manifest(ref)
    assert top.media_type == OCI_INDEX and top.digest == ref.digest
    listed = variants_from_index(top.doc, source=index)
    assert {v.digest: v.key for v in listed} == {v.digest: v.key for v in variants.values()}
    assert all(d["platform"]["variant"].startswith("kernelbake-sm_") for d in top.doc["manifests"])
    # Publishing the same variants again gives the same index (same tag, same digest).
    assert publish_index([v.pinned for v in variants.values()]) == index
    fleet = read_index(index)
    assert fleet is not None and fleet.ref.digest == ref.digest
    assert read_index(variants["h100"].pinned) is None


@pytest.mark.parametrize(
    ("how", "best", "order"),
    [
        (
            ["--gpu-product", "NVIDIA-H200"],
            "h200",
            ["NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"],
        ),
        (
            ["--node-labels", "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB-SHARED"],
            "a100-80gb",
            ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200"],
        ),
    ],
)
def test_resolve_prints_the_variants_best_first_and_the_digest_to_run(
    index: str, variants: dict[str, PushedImage], how: list[str], best: str, order: list[str]
) -> None:
    done = live.kernelbake("resolve", index, *how, "--json")
    doc = json.loads(done.stdout)
    assert doc["run"] == variants[best].pinned
    assert [v["device"] for v in doc["variants"]] == order
    assert doc["variants"][0]["tier"] == "same device" and doc["variants"][0]["reasons"] == []
    assert doc["variants"][1]["tier"] in ("same arch, other device", "no baked caches apply")
    text = live.kernelbake("resolve", index, *how).stdout
    assert f"run:   {variants[best].pinned}" in text


def test_resolve_exits_6_when_nothing_fits_and_names_the_reasons(index: str, tmp_path: Path) -> None:
    done = live.kernelbake("resolve", index, "--gpu-product", "NVIDIA-L4", check=False)
    assert done.returncode == 6, done.stderr
    assert "no variant fits" in done.stderr and "Traceback" not in done.stderr
    assert "arch: baked 'sm_90a', found 'sm_89'" in done.stdout
    # This CPU machine: no GPU, nothing baked for it fits either.
    here = live.kernelbake("resolve", index, "--here", check=False)
    assert here.returncode == 6 and "device 'cpu'" in here.stdout


def test_resolve_of_a_single_image_or_a_bad_product_is_bad_input(variants: dict[str, PushedImage]) -> None:
    done = live.kernelbake(
        "resolve", variants["h100"].pinned, "--gpu-product", "NVIDIA-H100-80GB-HBM3", check=False
    )
    assert done.returncode == 2 and "not a kernelbake GPU-variant index" in done.stderr
    done = live.kernelbake("resolve", variants["h100"].pinned, "--gpu-product", "NVIDIA-K80", check=False)
    assert done.returncode == 2 and "not a GPU product in kernelbake's catalogue" in done.stderr
