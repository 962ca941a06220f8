from __future__ import annotations

from typing import Any

import pytest

from kernelbake.admission.gpus import judge
from kernelbake.admission.policy import GpuMatch
from kernelbake.admission.scheduling import ways
from kernelbake.catalogue import load_catalogue
from kernelbake.contract.key import CacheKey
from kernelbake.gfd import FAMILY, PRODUCT, node_gpu
from tests.admission.documents import H100, expr

CC_MAJOR, CC_MINOR = "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor"


def spec(node_selector: dict[str, str] | None = None, *terms: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if node_selector is not None:
        out["nodeSelector"] = node_selector
    if terms:
        out["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
                }
            }
        }
    return out


def verdict(key: CacheKey, pod: dict[str, Any], match: GpuMatch = GpuMatch.DEVICE) -> tuple[bool, str, str]:
    v = judge(key, ways(pod), load_catalogue(), match)
    return v.ok, " | ".join(v.problems), " | ".join(v.notes)


def test_gfd_products_map_to_catalogue_devices() -> None:
    cat = load_catalogue()
    assert node_gpu(H100, cat).device == "NVIDIA H100 80GB HBM3"
    assert node_gpu(f"{H100}-SHARED", cat).device == "NVIDIA H100 80GB HBM3"
    mig = node_gpu(f"{H100}-MIG-1g.10gb", cat)
    assert (mig.device, mig.arch) == ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "sm_90a")
    assert (
        node_gpu("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED", cat).device == "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    )
    assert node_gpu("Tesla-V100-SXM2-16GB", cat).device is None


@pytest.mark.parametrize(
    "pod",
    [
        spec({PRODUCT: H100}),
        spec({PRODUCT: f"{H100}-SHARED"}),
        spec(None, [expr(PRODUCT, "In", H100, f"{H100}-SHARED")]),
        spec({"pool": "serving"}, [expr(PRODUCT, "In", H100)], [expr(PRODUCT, "In", f"{H100}-SHARED")]),
        # Redundant family / compute capability pins that agree are fine.
        spec({PRODUCT: H100, FAMILY: "hopper", CC_MAJOR: "9"}),
        # compute.major > 8 drops the A100 (8.0) from the In list.
        spec(
            None,
            [
                expr(PRODUCT, "In", H100, "NVIDIA-A100-SXM4-80GB"),
                expr(CC_MAJOR, "Gt", "8"),
                expr("x", "Exists"),
            ],
        ),
        # A term that contradicts itself (H200 is not ampere) places nothing; the other pins H100.
        spec(
            None,
            [expr(PRODUCT, "In", "NVIDIA-H200"), expr(FAMILY, "In", "ampere")],
            [expr(PRODUCT, "In", H100)],
        ),
        # NotIn inside an In narrows it.
        spec(None, [expr(PRODUCT, "In", H100, "NVIDIA-H200"), expr(PRODUCT, "NotIn", "NVIDIA-H200")]),
    ],
)
def test_pinned_to_the_baked_device_is_admitted(keys: dict[str, CacheKey], pod: dict[str, Any]) -> None:
    ok, problems, _ = verdict(keys["h100"], pod)
    assert ok, problems


def test_no_gpu_constraint_says_which_node_selector_to_add(keys: dict[str, CacheKey]) -> None:
    v = judge(keys["h100"], ways(spec({"pool": "serving"})), load_catalogue(), GpuMatch.DEVICE)
    assert not v.ok
    assert v.problems == ("its nodeSelector does not pin a GPU",)
    assert v.hint == f"add nodeSelector {PRODUCT}: {H100}"


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        (
            spec({PRODUCT: "NVIDIA-H200"}),
            "admits NVIDIA-H200: device: baked 'NVIDIA H100 80GB HBM3', found 'NVIDIA H200'",
        ),
        (spec({PRODUCT: "NVIDIA-A100-SXM4-80GB"}), "arch: baked 'sm_90a', found 'sm_80'"),
        (spec(None, [expr(PRODUCT, "In", H100, "NVIDIA-H100-PCIe")]), "admits NVIDIA-H100-PCIe: device"),
        # One of two ORed terms lets the pod land anywhere.
        (
            spec(None, [expr(PRODUCT, "In", H100)], [expr("pool", "In", "x")]),
            "required node affinity term 2 does not pin a GPU",
        ),
        (spec(None, [expr(PRODUCT, "NotIn", "NVIDIA-L4")]), "still admits nodes without GPU labels"),
        (
            spec(None, [expr(PRODUCT, "Exists")]),
            "pins nvidia.com/gpu.product Exists but not nvidia.com/gpu.product",
        ),
        (spec({FAMILY: "hopper"}), f"pins {FAMILY}=hopper but not {PRODUCT}"),
        (
            spec({PRODUCT: "Tesla-V100-SXM2-16GB"}),
            "admits Tesla-V100-SXM2-16GB, not a GPU product in kernelbake's catalogue",
        ),
        (spec({PRODUCT: f"{H100}-MIG-1g.10gb"}), "found 'NVIDIA H100 80GB HBM3 MIG 1g.10gb'"),
        (spec({PRODUCT: H100, FAMILY: "ampere"}), "no GPU node can satisfy its node constraints"),
        (spec(None, [expr(PRODUCT, "DoesNotExist")]), "does not pin a GPU"),
    ],
)
def test_mismatches_are_denied_with_the_reason(
    keys: dict[str, CacheKey], pod: dict[str, Any], expected: str
) -> None:
    ok, problems, _ = verdict(keys["h100"], pod)
    assert not ok
    assert expected in problems


def test_an_affinity_without_a_usable_term_is_denied(keys: dict[str, CacheKey]) -> None:
    pod: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}
        }
    }
    ok, problems, _ = verdict(keys["h100"], pod)
    assert not ok and "has no term that matches any node" in problems


def test_arch_mode_accepts_family_pins_and_notes_device_differences(keys: dict[str, CacheKey]) -> None:
    ok, problems, notes = verdict(keys["h100"], spec({FAMILY: "hopper"}), GpuMatch.ARCH)
    assert ok, problems
    assert "NVIDIA-H200" in notes and "recompiled" in notes
    ok, problems, _ = verdict(keys["h100"], spec({CC_MAJOR: "9", CC_MINOR: "0"}), GpuMatch.ARCH)
    assert ok, problems
    ok, problems, _ = verdict(keys["h100"], spec({FAMILY: "ampere"}), GpuMatch.ARCH)
    assert not ok and "arch: baked 'sm_90a', found 'sm_80'" in problems
    # Blackwell holds two archs (B200 sm_100a, RTX PRO 6000 sm_120a): family alone is not enough.
    ok, problems, _ = verdict(keys["b200"], spec({FAMILY: "blackwell"}), GpuMatch.ARCH)
    assert not ok and "found 'sm_120a'" in problems
    ok, problems, _ = verdict(keys["h100"], spec({FAMILY: "volta"}), GpuMatch.ARCH)
    assert not ok and "catalogue does not know" in problems
    ok, _, notes = verdict(keys["h100"], spec({PRODUCT: f"{H100}-MIG-1g.10gb"}), GpuMatch.ARCH)
    assert ok and "MIG 1g.10gb" in notes


def test_an_image_baked_on_a_mig_slice_matches_that_slice(keys: dict[str, CacheKey]) -> None:
    key = keys["h100"].replace(device="NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    ok, problems, _ = verdict(key, spec({PRODUCT: f"{H100}-MIG-1g.10gb"}))
    assert ok, problems
    v = judge(key, ways(spec({PRODUCT: H100})), load_catalogue(), GpuMatch.DEVICE)
    assert not v.ok and v.hint.endswith(f"{H100}-MIG-1g.10gb")


def test_a_cpu_image_needs_no_gpu(keys: dict[str, CacheKey]) -> None:
    key = keys["h100"].replace(device="cpu", arch="x86_64")
    assert verdict(key, spec(None))[0]
