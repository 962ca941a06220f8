"""The index contract and the resolver's ranking, pure: no registry."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelbake.catalogue import load_catalogue
from kernelbake.contract.compat import Tier, rank_variants
from kernelbake.contract.key import CacheKey
from kernelbake.contract.variants import (
    ANNOTATION_DEVICE,
    ANNOTATION_KEY_DIGEST,
    InvalidIndex,
    Variant,
    encode,
    index_document,
    index_tag,
    is_gpu,
    variants_from_index,
)
from kernelbake.fleet import found_for_labels, found_for_product, parse_labels
from kernelbake.plan import plan
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.strategies import keys

GPUS = ("h100", "h100-pcie", "h200", "a100-80gb", "l4")


def planned() -> dict[str, CacheKey]:
    targets = plan(load_spec(REPO / "images" / "qwen3-0.6b.yaml"), list(GPUS), registry="r.example/kb")
    return {t.gpu.name: t.key for t in targets}


def variant(key: CacheKey, n: int) -> Variant:
    return Variant(
        key=key,
        digest="sha256:" + f"{n:x}" * 64,
        size=100 + n,
        media_type="application/vnd.oci.image.manifest.v1+json",
    )


@given(st.lists(keys(), min_size=1, max_size=5, unique_by=lambda k: k.digest))
def test_an_index_round_trips_its_variants(found: list[CacheKey]) -> None:
    variants = [variant(k, i % 16) for i, k in enumerate(found)]
    doc = index_document(variants)
    back = variants_from_index(doc, source="test")
    assert {v.key for v in back} == set(found)
    gpu = [is_gpu(v.key) for v in back]
    assert gpu == sorted(gpu)  # CPU variants (no GPU kernels) first


def test_gpu_variants_carry_a_platform_variant_no_runtime_matches_and_cpu_comes_first() -> None:
    keys_ = planned()
    cpu = plan(load_spec(REPO / "images" / "tiny-llama.yaml"), ["cpu"])[0].key
    doc = index_document([variant(keys_["h100"], 1), variant(cpu, 2)])
    first, second = doc["manifests"]
    assert first["platform"] == {"architecture": "amd64", "os": "linux"}
    assert second["platform"] == {"architecture": "amd64", "os": "linux", "variant": "kernelbake-sm_90a"}
    assert second["annotations"][ANNOTATION_DEVICE] == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("field", [ANNOTATION_DEVICE, ANNOTATION_KEY_DIGEST, "platform"])
def test_an_edited_annotation_is_caught(field: str) -> None:
    doc = index_document([variant(planned()["h100"], 1)])
    edited = copy.deepcopy(doc)
    entry = edited["manifests"][0]
    if field == "platform":
        entry["platform"].pop("variant")
    else:
        entry["annotations"][field] = "NVIDIA H200" if field == ANNOTATION_DEVICE else "sha256:" + "0" * 64
    with pytest.raises(InvalidIndex, match="disagree"):
        variants_from_index(edited, source="test")


def test_an_index_refuses_two_variants_with_one_key_and_tags_change_with_keys() -> None:
    k = planned()
    with pytest.raises(InvalidIndex, match="same key"):
        index_document([variant(k["h100"], 1), variant(k["h100"], 2)])
    assert index_tag([k["h100"], k["h200"]]) == index_tag([k["h200"], k["h100"]])
    assert index_tag([k["h100"], k["h200"]]) != index_tag([k["h100"], k["l4"]])
    assert encode(index_document([variant(k["h100"], 1)])) == encode(index_document([variant(k["h100"], 1)]))


@pytest.mark.parametrize(
    ("product", "expected"),
    [
        # Same device first; same arch other device next; another arch would start cold.
        ("NVIDIA-H100-80GB-HBM3", ["h100", "h100-pcie", "h200", "a100-80gb", "l4"]),
        ("NVIDIA-H200-SHARED", ["h200", "h100", "h100-pcie", "a100-80gb", "l4"]),
        ("NVIDIA-L4", ["l4", "h100", "h100-pcie", "h200", "a100-80gb"]),
    ],
)
def test_variants_rank_same_device_then_same_arch_then_cold(product: str, expected: list[str]) -> None:
    k = planned()
    names = list(GPUS)
    ranked = rank_variants([k[n] for n in names], found_for_product(product))
    assert [names[c.index] for c in ranked] == expected
    assert ranked[0].tier is Tier.SAME_DEVICE and ranked[0].fits
    tiers = [c.tier for c in ranked]
    assert tiers == sorted(tiers, key=list(Tier).index)
    cold = [c for c in ranked if c.tier is Tier.COLD]
    assert cold and all("arch: baked" in c.summary() for c in cold)


def test_a_mig_slice_is_its_own_device_and_a_driver_below_the_floor_cannot_run() -> None:
    k = planned()
    ranked = rank_variants([k["h100"]], found_for_product("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"))
    assert ranked[0].tier is Tier.SAME_ARCH
    old = {**found_for_product("NVIDIA-H100-80GB-HBM3"), "driver": "470.1"}
    assert rank_variants([k["h100"]], old)[0].tier is Tier.UNUSABLE


def test_node_labels_without_a_product_fit_at_best_by_arch() -> None:
    found = found_for_labels(parse_labels("nvidia.com/gpu.family=hopper"))
    ranked = rank_variants([planned()["h100"]], found)
    assert found["arch"] == "sm_90a" and ranked[0].tier is Tier.SAME_ARCH
    assert found_for_labels({"nvidia.com/gpu.product": "NVIDIA-H200"}) == {
        "device": "NVIDIA H200",
        "arch": "sm_90a",
    }
    with pytest.raises(Exception, match="one GPU arch"):
        found_for_labels({"nvidia.com/gpu.compute.major": "8"})
    with pytest.raises(Exception, match="not key=value"):
        parse_labels("nvidia.com/gpu.product")
    assert load_catalogue().gpu("h100").arch == "sm_90a"
