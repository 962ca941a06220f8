"""Compatibility between a baked key and what is found (a GPU node, a running container).

Never a bare bool: ``check`` returns a ``Match`` carrying every reason.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

from kernelbake.contract.key import NONE, CacheKey, key_from_fields


class Severity(enum.Enum):
    # The cache would be rebuilt or unusable: start cold.
    BLOCKING = "blocking"
    # Worth saying, but the baked caches are still valid (e.g. a newer driver).
    NOTE = "note"


@dataclasses.dataclass(frozen=True)
class Reason:
    field: str
    expected: str
    found: str
    severity: Severity
    why: str

    def __str__(self) -> str:
        return f"{self.field}: baked {self.expected!r}, found {self.found!r} ({self.why})"


@dataclasses.dataclass(frozen=True)
class Match:
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


# Why a difference in each field invalidates the cache, for messages users can act on.
_WHY = {
    "engine": "a different engine compiles different code",
    "engine_version": "the engine's compile hash includes its version",
    "torch": "Inductor caches are keyed by the torch version",
    "triton": "Triton kernels are keyed by the Triton version",
    "cuda": "compiled kernels target one CUDA version",
    "flashinfer": "FlashInfer JIT modules are built against one FlashInfer version",
    "python": "Dynamo bytecode is specific to one Python minor version",
    "arch": "kernels are compiled for one GPU architecture",
    "device": "the engine's compile hash includes the exact device name",
    "model": "compiled graphs belong to one model",
    "revision": "compiled graphs belong to one model revision",
    "model_path": "vLLM hashes the model path",
    "dtype": "the dtype shapes every kernel",
    "quantization": "quantization changes the compiled kernels",
    "tp": "tensor parallelism changes the sharded shapes",
    "pp": "pipeline parallelism changes the compiled graph split",
    "ep": "expert parallelism changes the MoE kernels",
    "max_model_len": "vLLM hashes max_model_len",
    "max_num_batched_tokens": "compiled shapes are sized by max_num_batched_tokens",
    "compilation": "the compilation config is part of the compile hash",
    "engine_env": "the engine hashes these environment variables",
    "kernelbake": "the bundle layout belongs to one kernelbake version",
}


def _driver_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def check(baked: CacheKey, found: CacheKey) -> Match:
    """Compare the key an image was baked with against the key of the place it runs.

    ``found.driver_floor`` holds the *installed* driver there; every other field must match
    exactly. A newer kernelbake reading an older bundle is a note, not a blocker, because the
    bundle format is versioned separately in its manifest.
    """
    reasons: list[Reason] = []
    want, have = baked.as_dict(), found.as_dict()
    for name in CacheKey.field_order():
        if name == "driver_floor":
            floor, installed = want[name], have[name]
            if floor == NONE:
                continue
            if installed == NONE or _driver_tuple(installed) < _driver_tuple(floor):
                reasons.append(
                    Reason(
                        name, floor, installed, Severity.BLOCKING, f"the image's CUDA needs driver ≥ {floor}"
                    )
                )
            continue
        if want[name] != have[name]:
            severity = Severity.NOTE if name == "kernelbake" else Severity.BLOCKING
            reasons.append(Reason(name, want[name], have[name], severity, _WHY[name]))
    return Match(baked, tuple(reasons))


def check_fields(baked: CacheKey, found: Mapping[str, str]) -> Match:
    """Like ``check`` for a partial view of the place it runs (e.g. a Kubernetes node's
    GPU labels give only device, arch and maybe driver): fields absent from ``found`` are
    not judged."""
    merged = baked.as_dict()
    merged.update({k: v for k, v in found.items() if k in merged})
    return check(baked, key_from_fields(merged, source="(found)"))
