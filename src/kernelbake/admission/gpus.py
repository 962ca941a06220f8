"""Does every way a pod can schedule land it on a GPU its image was baked for?

Nodes are described by the labels NVIDIA GPU Feature Discovery (GFD) writes:
``nvidia.com/gpu.product`` (the device name with spaces as ``-``; ``-SHARED`` appended under
time-slicing or MPS), ``nvidia.com/gpu.family`` and ``nvidia.com/gpu.compute.major``/``minor``.
For each way the pod can schedule we enumerate the GPU nodes that could satisfy it from the
catalogue and compare each with the baked key through ``compat`` (reasons, not bools).

Decisions, documented in docs/admission.md ("GPU matching") (the label reading itself is ``kernelbake.gfd``):
- ``-SHARED`` products are the same device: a time-sliced H100 runs H100 kernels.
- MIG products (``NVIDIA-H100-80GB-HBM3-MIG-1g.10gb``) have the parent's arch, but CUDA reports
  the slice as its own device (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``), and that name is in vLLM's
  compile hash: they match only an image baked on that slice (or in ``gpu.match: arch`` mode,
  where a device difference is a warning).
- A product the catalogue does not know cannot be judged and is a mismatch.
- In ``device`` mode a family or compute-capability pin is not enough: every family holds
  several device names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kernelbake.admission.memo import Answers
from kernelbake.admission.policy import GpuMatch
from kernelbake.admission.scheduling import Operator, Requirement, Way
from kernelbake.catalogue import CPU, Catalogue
from kernelbake.contract.compat import Reason, check_fields
from kernelbake.contract.key import CacheKey
from kernelbake.gfd import GPU_LABELS, PRODUCT, NodeGpu, node_gpu, product_for

_LISTED = 3


@dataclasses.dataclass(frozen=True)
class GpuVerdict:
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    # The nodeSelector that would fix it, for messages.
    hint: str

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(key: CacheKey, ways: Sequence[Way], catalogue: Catalogue, match: GpuMatch) -> GpuVerdict:
    hint = f"add nodeSelector {PRODUCT}: {product_for(key.device)}"
    baked = catalogue.gpu_by_device_name(key.device)
    if baked is not None and baked.name == CPU:
        return GpuVerdict((), (), hint)
    if not ways:
        return GpuVerdict(("its required node affinity has no term that matches any node",), (), hint)
    problems: list[str] = []
    notes: list[str] = []
    satisfiable = 0
    for way in ways:
        way_problems, way_notes, possible = _judge_way(key, way, catalogue, match)
        problems += way_problems
        notes += way_notes
        satisfiable += possible
    if not satisfiable:
        problems.append("no GPU node can satisfy its node constraints")
    return GpuVerdict(tuple(problems), tuple(notes), hint)


class Judge(Answers[CacheKey, GpuVerdict]):
    """``judge`` for one catalogue and match mode, memoised (``memo``): the verdict depends only
    on the key and the ways."""

    def _answer(self, key: CacheKey, ways: Sequence[Way]) -> GpuVerdict:
        return judge(key, ways, self.catalogue, self.match)


@dataclasses.dataclass(frozen=True)
class Admitted:
    """The GPU nodes one way can land on, as far as their GFD labels tell."""

    way: Way
    gpu_requirements: tuple[Requirement, ...]
    # False: a node without GPU labels satisfies the way, so the pod may run anywhere.
    pins_gpu: bool
    # No product pin (family, compute capability …): every catalogue GPU those labels match.
    open_ended: bool
    gpus: tuple[NodeGpu, ...]

    def unpinned(self) -> str:
        """The problem when ``pins_gpu`` is False."""
        reqs = self.gpu_requirements
        still = f" ({', '.join(map(str, reqs))} still admits nodes without GPU labels)" if reqs else ""
        return f"{self.way.source} does not pin a GPU{still}"

    def no_product(self) -> str:
        """The problem of an ``open_ended`` way in ``gpu.match: device`` mode."""
        pins = ", ".join(map(str, self.gpu_requirements))
        return f"{self.way.source} pins {pins} but not {PRODUCT}, and vLLM's compile hash includes the exact device name"


def admitted(way: Way, catalogue: Catalogue) -> Admitted:
    """The GPU products ``way`` admits (admission's variant choice reads them too)."""
    gpu_reqs = tuple(r for r in way.requirements if r.key in GPU_LABELS)
    if all(r.matches({}) for r in gpu_reqs):
        return Admitted(way, gpu_reqs, False, False, ())
    product_ins = [r for r in gpu_reqs if r.key == PRODUCT and r.operator is Operator.IN]
    if product_ins:
        # Sets: the lists are the pod author's, and intersecting them pairwise is quadratic.
        allowed = [p for p in product_ins[0].values if all(p in r.value_set for r in product_ins[1:])]
        candidates = [node_gpu(p, catalogue) for p in dict.fromkeys(allowed)]
    else:
        # -SHARED variants carry the same labels, so one product per device decides.
        candidates = [node_gpu(g.gfd_product[0], catalogue) for g in catalogue.gpus.values() if g.gfd_product]
    gpus = tuple(
        n
        for n in candidates
        if all(r.matches(n.labels) for r in gpu_reqs if n.device is not None or r.key == PRODUCT)
    )
    return Admitted(way, gpu_reqs, True, not product_ins, gpus)


def _judge_way(
    key: CacheKey, way: Way, catalogue: Catalogue, match: GpuMatch
) -> tuple[list[str], list[str], bool]:
    """(problems, notes, whether any GPU node can satisfy this way)."""
    found = admitted(way, catalogue)
    if not found.pins_gpu:
        return [found.unpinned()], [], True
    problems = _pin_problems(found, match)
    mismatched, tolerated = _compared(key, found, match)
    problems += [f"{way.source} admits {listed(p)}: {reason}" for reason, p in mismatched.items()]
    notes = []
    if match is GpuMatch.ARCH:
        notes = [
            f"{way.source} admits {listed(p)}: {reason}; the caches will be recompiled there"
            for reason, p in tolerated.items()
        ]
    return problems, notes, bool(found.gpus) or found.open_ended


def _pin_problems(found: Admitted, match: GpuMatch) -> list[str]:
    """What is wrong with the way's GPU pins themselves, whatever the key."""
    problems: list[str] = []
    unknown = [n.product for n in found.gpus if n.device is None]
    if unknown:
        problems.append(
            f"{found.way.source} admits {listed(unknown)}, not a GPU product in kernelbake's catalogue"
        )
    if found.open_ended and match is GpuMatch.DEVICE:
        problems.append(found.no_product())
    elif found.open_ended and not found.gpus:
        pins = ", ".join(str(r) for r in found.gpu_requirements)
        problems.append(f"{found.way.source} admits only GPUs kernelbake's catalogue does not know ({pins})")
    return problems


def _compared(
    key: CacheKey, found: Admitted, match: GpuMatch
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(mismatched, tolerated): each reason the key does not fit, with the products it holds for."""
    mismatched: dict[str, list[str]] = {}
    tolerated: dict[str, list[str]] = {}
    # Many products (-SHARED, MIG slices, repeats) share a device: compare each device once.
    compared: dict[tuple[str, str], tuple[Reason, ...]] = {}
    for n in found.gpus:
        if n.device is None or n.arch is None:
            continue
        platform = (n.device, n.arch)
        if platform not in compared:
            compared[platform] = check_fields(key, {"device": n.device, "arch": n.arch}).blocking
        for reason in compared[platform]:
            # Arch mode tolerates another device; an open-ended way was already reported.
            tolerable = reason.field == "device" and (match is GpuMatch.ARCH or found.open_ended)
            (tolerated if tolerable else mismatched).setdefault(str(reason), []).append(n.product)
    return mismatched, tolerated


def listed(items: Sequence[str]) -> str:
    """A few of ``items``, and how many more."""
    shown = ", ".join(items[:_LISTED])
    return shown + (f" and {len(items) - _LISTED} more" if len(items) > _LISTED else "")
