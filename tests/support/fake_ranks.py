"""A multi-process fake of vLLM's executor at TP/PP > 1, for what needs no GPU.

``collective`` starts one process per rank, as vLLM's multiproc executor does; each writes its
caches where vLLM 0.26's workers write theirs (its own ``rank_<r>_0`` directories beside the
shared Inductor directory) and answers like ``_v0_26.rank_report`` does through
``collective_rpc``. ``MultiRankCompileOnly`` stands in for the compile-only subprocess and
folds the answers into its report with the same function compile-only uses.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelbake.runner import Result
from kernelbake.runtime.engines.vllm.plugin import WEIGHTS_ENV
from kernelbake.runtime.engines.vllm.ranks import fold_ranks

if TYPE_CHECKING:
    from kernelbake.runner import Runner

BACKBONE_HASH = "67a6adfe44"
AOT_HASH = "a3b0e6d9" * 8
MIB = 1 << 20

# How one rank lays out its files; tests swap it for a vLLM that lays them out otherwise.
Layout = Callable[[Path, int], tuple[list[Path], list[Path]]]


def vllm_layout(vllm_root: Path, rank: int) -> tuple[list[Path], list[Path]]:
    """(files this rank writes, the AOT artifacts among them), as vLLM 0.26 names them."""
    tc = vllm_root / "torch_compile_cache"
    backbone = tc / BACKBONE_HASH / f"rank_{rank}_0" / "backbone"
    aot = tc / "torch_aot_compile" / AOT_HASH / f"rank_{rank}_0" / "model"
    # Every rank writes the kernels it compiled into the one directory the ranks share.
    shared = tc / "torch_aot_compile" / AOT_HASH / "inductor_cache" / f"k{rank % 2}" / f"kernel-{rank}.py"
    return [backbone / "computation_graph.py", backbone / "cache_key_factors.json", aot, shared], [aot]


def _rank_main(
    rank: int, tp: int, vllm_root: str, layout: Layout, answers: multiprocessing.Queue[dict[str, Any]]
) -> None:
    files, saved = layout(Path(vllm_root), rank)
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(f"rank {rank} pid {os.getpid()} {f.name}".encode())
    answers.put(
        {
            "rank": rank,
            "dp_rank": 0,
            "tp_rank": rank % tp,
            "pp_rank": rank // tp,
            "aot_paths": [str(p) for p in saved],
            "aot_saved": len(saved),
            "compiled_modules": 1,
            "fake_tensors": 291,
            "weights_mode": "fake",
            # Stand-ins for torch.cuda's counters, different per rank so a mix-up shows.
            "peak_at_aot_save_bytes": (700 + 10 * rank) * MIB,
            "allocated_at_aot_save_bytes": (6 + rank) * MIB,
            "peak_after_aot_save_bytes": (400 + rank) * MIB,
            "allocated_at_end_bytes": (900 + rank) * MIB,
        }
    )


def collective(
    world: int, tp: int, vllm_root: Path, *, layout: Layout = vllm_layout, silent: Sequence[int] = ()
) -> list[dict[str, Any]]:
    """Start ``world`` rank processes and collect each one's answer (``silent`` ranks never
    start, like a worker that died before answering)."""
    ctx = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[dict[str, Any]] = ctx.Queue()
    procs = [
        ctx.Process(target=_rank_main, args=(r, tp, str(vllm_root), layout, queue))
        for r in range(world)
        if r not in silent
    ]
    for p in procs:
        p.start()
    answers = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"rank process {p.pid} exited {p.exitcode}"
    return answers


class MultiRankCompileOnly:
    """Stands in for the compile-only subprocess at ``world`` ranks."""

    def __init__(self, world: int, tp: int, **collective_kw: Any) -> None:
        self.world, self.tp, self.kw = world, tp, collective_kw

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **_: object) -> Result:
        assert env is not None
        triton = Path(env["TRITON_CACHE_DIR"]) / "abc" / "k.cubin"
        triton.parent.mkdir(parents=True, exist_ok=True)
        triton.write_bytes(b"kernel")
        report: dict[str, Any] = {"hashed_env": {"VLLM_X": "1"}, "wall_s": 1.0}
        fold_ranks(report, collective(self.world, self.tp, Path(env["VLLM_CACHE_ROOT"]), **self.kw))
        # kernelbake lets compile-only choose (``auto``: vLLM's model config decides); these
        # ranks report the dense model's answer, fake weights.
        assert env[WEIGHTS_ENV] == "auto"
        Path(argv[argv.index("--report") + 1]).write_text(json.dumps(report))
        return Result(tuple(argv), 0)


if TYPE_CHECKING:
    # mypy: stands in wherever a Runner is taken (the other keywords are accepted and unused).
    _runner: Runner = MultiRankCompileOnly(1, 1)
