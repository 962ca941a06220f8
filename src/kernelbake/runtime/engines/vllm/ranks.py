"""Per-rank caches of a vLLM compile at tensor or pipeline parallelism above 1.

Every vLLM worker compiles its own shard of the model and keeps its torch.compile artifacts
in directories of its own, beside those the ranks on a node share (Inductor's, Triton's,
FlashInfer's). In vLLM 0.26 (``compilation/backends.py``, ``compilation/decorators.py``):

    vllm/torch_compile_cache/<hash>/rank_<rank>_<dp>/<prefix>/...
    vllm/torch_compile_cache/torch_aot_compile/<hash>/rank_<rank>_<dp>/model
    vllm/torch_compile_cache/torch_aot_compile/<hash>/inductor_cache/...      (shared)

Compile-only asks every worker, through vLLM's ``collective_rpc``, for its rank and for the
paths it saved its artifacts to (``_v0_26.rank_report``). Here those answers become the
manifest's rank entries and the compile report's per-rank facts. Pure, so it is tested
without vLLM, with processes that act as ranks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.contract.layout import CacheKind, kind_dir
from kernelbake.contract.manifest import RankEntry
from kernelbake.errors import BuildFailed

# vLLM 0.26's name for a rank's directory. Copied, so ``rank_entries`` checks it against the
# paths the workers say they wrote: a vLLM that names them otherwise fails the build.
RANK_DIR = "rank_{rank}_{dp_rank}"

# Per-rank facts kept in the compile report (the rest of a worker's answer is evidence).
RANK_FACTS = (
    "tp_rank",
    "pp_rank",
    "dp_rank",
    "peak_at_aot_save_bytes",
    "allocated_at_aot_save_bytes",
    "peak_after_aot_save_bytes",
    "allocated_at_end_bytes",
    "aot_saved",
    "aot_loaded",
    "compiled_modules",
    "fake_tensors",
    "weights_mode",
)

# The worst rank's value stands for the run in the report's top level, where a single-GPU
# compile puts its own: a per-rank limit holds for every rank when it holds for the worst.
_WORST_OF = (
    "peak_at_aot_save_bytes",
    "allocated_at_aot_save_bytes",
    "peak_after_aot_save_bytes",
    "allocated_after_load_bytes",
)
# Facts every rank shares (how its weights were faked, how many graphs it compiled).
_FROM_RANK_0 = ("weights_mode", "aot_saved", "aot_loaded", "compiled_modules", "fake_tensors", "lent_bytes")


def rank_dir_name(rank: int, dp_rank: int = 0) -> str:
    return RANK_DIR.format(rank=rank, dp_rank=dp_rank)


def fold_ranks(report: MutableMapping[str, Any], answers: Sequence[Mapping[str, Any]]) -> None:
    """Put every worker's answer under ``ranks`` and fill the top-level facts a compile in
    this process did not measure itself (at TP/PP > 1 the workers are other processes)."""
    ordered = sorted(answers, key=lambda a: int(a["rank"]))
    report["ranks"] = [dict(a) for a in ordered]
    if not ordered:
        return
    for key in _WORST_OF:
        values = [a[key] for a in ordered if isinstance(a.get(key), int)]
        if key not in report and values:
            report[key] = max(values)
    for key in _FROM_RANK_0:
        if key not in report and key in ordered[0]:
            report[key] = ordered[0][key]


def _dirs_named(base: Path, name: str) -> list[Path]:
    found = []
    for dirpath, dirs, _files in os.walk(base):
        for d in list(dirs):
            if d == name:
                found.append(Path(dirpath) / d)
                dirs.remove(d)  # a rank's directory holds no other rank's
    return sorted(found)


def _files_under(dirs: Sequence[Path]) -> int:
    return sum(len(names) for d in dirs for _p, _d, names in os.walk(d))


def rank_entries(root: Path, answers: Sequence[Mapping[str, Any]], world: int) -> tuple[RankEntry, ...]:
    """The manifest's rank entries for a compile of ``world`` ranks under ``root``.

    Fails the build when a rank did not answer or answered twice, when a rank saved an
    artifact outside a directory named for it, or when some ranks left files and others none:
    a bundle recorded wrongly would be vouched for at serve time and then miss.
    """
    ranks = sorted(int(a["rank"]) for a in answers)
    if ranks != list(range(world)):
        raise BuildFailed(
            f"vLLM compile-only: ranks {ranks} answered, a world of {world} has ranks 0..{world - 1}",
            hint="see the compile log for a worker that failed or was not started",
        )
    base = kind_dir(root, CacheKind.VLLM)
    entries: list[RankEntry] = []
    counts: dict[int, int] = {}
    for answer in sorted(answers, key=lambda a: int(a["rank"])):
        rank = int(answer["rank"])
        dirs = _dirs_named(base, rank_dir_name(rank, int(answer.get("dp_rank", 0))))
        for saved in answer.get("aot_paths", []):
            if not any(Path(saved).is_relative_to(d) for d in dirs):
                raise BuildFailed(
                    f"vLLM compile-only: rank {rank} saved {saved}, outside every "
                    f"{rank_dir_name(rank, int(answer.get('dp_rank', 0)))} directory under {base}; "
                    "this vLLM lays out per-rank caches differently from what kernelbake records",
                    hint="update kernelbake.runtime.engines.vllm.ranks for this vLLM release",
                )
        counts[rank] = _files_under(dirs)
        entries.append(RankEntry(rank, tuple(d.relative_to(root).as_posix() for d in dirs)))
    empty = [r for r, n in counts.items() if n == 0]
    if empty and len(empty) < world:
        raise BuildFailed(
            f"vLLM compile-only: rank(s) {', '.join(map(str, empty))} left no torch.compile files "
            f"while the other ranks did; every rank's caches must be baked",
            hint="see the compile log of those ranks",
        )
    return tuple(entries)


def rank_facts(answers: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the compile report keeps of each rank's answer, keyed by rank."""
    return {
        str(a["rank"]): {k: a[k] for k in RANK_FACTS if k in a}
        for a in sorted(answers, key=lambda a: int(a["rank"]))
    }
