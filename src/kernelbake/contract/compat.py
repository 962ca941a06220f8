"""Compatibility between a baked key and what is found (a GPU node, a running container).

Never a bare bool: ``check`` returns a ``Match`` carrying every reason. What is found is a
``Platform``: the measured fields the key names, and the installed driver that the key's
``driver_floor`` bounds.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence

from kernelbake.contract.key import NONE, CacheKey
from kernelbake.contract.platform import Platform


class Severity(enum.Enum):
    """How much one difference between the baked key and what is found matters."""

    # The cache would be rebuilt or unusable: start cold.
    BLOCKING = "blocking"
    # Worth saying, but the baked caches are still valid (e.g. a newer driver).
    NOTE = "note"


@dataclasses.dataclass(frozen=True)
class Reason:
    """One field the baked key and what is found disagree on, and why that matters (for messages)."""

    field: str
    expected: str
    found: str
    severity: Severity
    why: str

    def __str__(self) -> str:
        return f"{self.field}: baked {self.expected!r}, found {self.found!r} ({self.why})"


@dataclasses.dataclass(frozen=True)
class Match:
    """A key checked against what is found: every reason, never a bare bool (``usable`` if none blocks)."""

    key: CacheKey
    reasons: tuple[Reason, ...]

    @property
    def blocking(self) -> tuple[Reason, ...]:
        return tuple(r for r in self.reasons if r.severity is Severity.BLOCKING)

    @property
    def usable(self) -> bool:
        return not self.blocking

    def summary(self) -> str:
        if not self.reasons:
            return "exact match"
        return "; ".join(str(r) for r in self.reasons)


# Why a difference in each measured field invalidates the cache, for messages users can act on.
_WHY = {
    "engine_version": "the engine's compile hash includes its version",
    "torch": "Inductor caches are keyed by the torch version",
    "triton": "Triton kernels are keyed by the Triton version",
    "cuda": "compiled kernels target one CUDA version",
    "flashinfer": "FlashInfer JIT modules are built against one FlashInfer version",
    "python": "Dynamo bytecode is specific to one Python minor version",
    "arch": "kernels are compiled for one GPU architecture",
    "device": "the engine's compile hash includes the exact device name",
}


# The installed driver, judged against the key's driver_floor.
_DRIVER = "driver"


def _driver_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def check(baked: CacheKey, found: Platform) -> Match:
    """Compare the key an image was baked with against the platform it builds or runs on.

    Every measured field must match exactly, and the installed driver must reach the key's
    ``driver_floor``.
    """
    return check_fields(baked, found.fields())


def check_fields(baked: CacheKey, found: Mapping[str, str]) -> Match:
    """Like ``check`` for a partial view of the platform (e.g. a Kubernetes node's GPU labels
    give only device, arch and maybe driver): fields absent from ``found`` are not judged."""
    names = Platform.field_names()
    unknown = sorted(set(found) - set(names))
    if unknown:
        raise ValueError(f"not platform fields: {unknown}")
    reasons: list[Reason] = []
    want = baked.as_dict()
    for name in names:
        if name not in found:
            continue
        have = found[name]
        if name == _DRIVER:
            floor = want["driver_floor"]
            if floor != NONE and (have == NONE or _driver_tuple(have) < _driver_tuple(floor)):
                reasons.append(
                    Reason(
                        "driver_floor",
                        floor,
                        have,
                        Severity.BLOCKING,
                        f"the image's CUDA needs driver ≥ {floor}",
                    )
                )
        elif want[name] != have:
            reasons.append(Reason(name, want[name], have, Severity.BLOCKING, _WHY[name]))
    return Match(baked, tuple(reasons))


class Tier(enum.Enum):
    """How well a variant fits a GPU, best first (pip prefers a wheel built for the platform,
    then a more generic wheel, then building from source)."""

    # Every baked cache applies.
    SAME_DEVICE = "same device"
    # The kernels run (same arch); caches keyed by the device name (vLLM's torch.compile
    # hash) are rebuilt at start, those keyed by arch (Triton, FlashInfer) still apply.
    SAME_ARCH = "same arch, other device"
    # Nothing baked applies: the engine starts cold.
    COLD = "no baked caches apply"
    # The image cannot run here at all (the installed driver is below its CUDA's floor).
    UNUSABLE = "cannot run here"


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One variant judged for one GPU: its tier and every reason behind it."""

    index: int
    match: Match
    tier: Tier

    @property
    def fits(self) -> bool:
        """Worth running: some baked kernels apply."""
        return self.tier in (Tier.SAME_DEVICE, Tier.SAME_ARCH)

    def summary(self) -> str:
        return f"{self.tier.value}: {self.match.summary()}"


def tier_of(match: Match) -> Tier:
    if match.usable:
        return Tier.SAME_DEVICE
    blocking = {r.field for r in match.blocking}
    if "driver_floor" in blocking:
        return Tier.UNUSABLE
    if blocking == {"device"}:
        return Tier.SAME_ARCH
    return Tier.COLD


def rank_variants(keys: Sequence[CacheKey], found: Mapping[str, str]) -> list[Candidate]:
    """Every variant judged against ``found`` (partial platform facts: device, arch, installed
    driver …), best first: by tier, then fewest reasons, then the index's order."""
    candidates = [Candidate(i, m, tier_of(m)) for i, m in enumerate(check_fields(k, found) for k in keys)]
    order = list(Tier)
    return sorted(candidates, key=lambda c: (order.index(c.tier), len(c.match.reasons), c.index))
