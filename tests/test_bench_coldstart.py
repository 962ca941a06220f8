"""The GPU cold-start bench (bench/vllm_coldstart.py) at ``--tp N``: its plan and its result
assembly run here, on CPU, so a device session spends its time measuring, not debugging.
The compile lane runs for real with processes acting as vLLM's ranks (tests/support/fake_ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kernelbake.runtime.engines import vllm as vllm_engine
from tests.conftest import REPO
from tests.support import bench
from tests.support.fake_engine import platform_for
from tests.support.fake_ranks import MIB, MultiRankCompileOnly

BENCH = REPO / "bench" / "vllm_coldstart.py"


def _bench() -> ModuleType:
    return bench.load("vllm_coldstart")


def test_result_files_are_named_per_machine_and_tp() -> None:
    bench = _bench()
    assert bench.result_name(1) == "vllm-0.26.0-h200.json"
    assert bench.result_name(2) == "vllm-0.26.0-h200x2-tp2.json"
    assert bench.result_name(4) == "vllm-0.26.0-h200x4-tp4.json"


def test_lanes_split_the_cores_of_any_machine() -> None:
    bench = _bench()
    assert bench.core_groups(list(range(16))) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]
    groups = bench.core_groups(list(range(64)))
    assert [len(g) for g in groups] == [16, 16, 16, 16] and groups[3][-1] == 63


def test_dry_run_prints_the_plan_at_tp_4_without_vllm(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--tp",
            "4",
            "--dry-run",
            "--out",
            str(tmp_path),
            "--runs",
            "compile,cold,baked",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )
    plan = json.loads(out.stdout)
    assert plan["result"] == str(tmp_path / "vllm-0.26.0-h200x4-tp4.json")
    for model in plan["models"].values():
        assert ";tp=4;pp=1;" in model["key"]
        argv = model["serve_argv"]
        assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
        assert model["roots"]["cold"].endswith("-tp4/cold/cache")
    assert [j["name"] for j in plan["jobs"]] == [
        "compile-qwen3-8b-dummy",
        "compile-tiny-llama-ref",
        "cold-qwen3-8b-dummy",
        "cold-tiny-llama-ref",
        "baked-qwen3-8b-dummy",
        "baked-tiny-llama-ref",
    ]
    assert all(j["argv"][-2:] == ["--tp", "4"] for j in plan["jobs"])


def _compile_lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tp: int
) -> tuple[ModuleType, dict[str, Any]]:
    bench = _bench()
    monkeypatch.setattr(bench, "WORK", tmp_path / "work")
    target = bench._target("qwen3-8b-dummy", tp)
    engine = vllm_engine.VllmEngine(runner=MultiRankCompileOnly(tp, tp))
    monkeypatch.setattr(engine, "probe", lambda: platform_for(target.key))
    monkeypatch.setattr(vllm_engine, "VllmEngine", lambda: engine)
    return bench, bench.lane_compile("qwen3-8b-dummy", tmp_path, tp)


def _runs(compiled: dict[str, Any], cold_s: float = 180.0, baked_s: float = 20.0) -> dict[str, Any]:
    tokens = list(range(16))
    return {
        "compile-qwen3-8b-dummy": compiled,
        "cold-qwen3-8b-dummy": {"start_s": cold_s, "tokens": tokens},
        "baked-qwen3-8b-dummy": {"start_s": baked_s, "tokens": tokens, "files_added": {"vllm": 0}},
    }


def test_a_tp_2_result_has_each_ranks_memory_and_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench, compiled = _compile_lane(tmp_path, monkeypatch, 2)
    assert {r: t["files"] for r, t in compiled["rank_files"].items()} == {"0": 3, "1": 3}
    s = bench.summarise(_runs(compiled), 2)["qwen3-8b-dummy"]
    assert s["tensor_parallel_size"] == 2
    assert (s["speedup_baked"], s["speedup_target"], s["speedup_ok"]) == (9.0, 8.0, True)
    assert s["tokens_identical"] is True
    assert s["every_rank_baked"] is True
    assert s["ranks"]["1"] == {
        "tp_rank": 1,
        "pp_rank": 0,
        "compile_peak_mib": 710.0,
        "held_at_aot_save_mib": 7.0,
        "held_at_end_of_start_mib": 901.0,
        "peak_ok": True,
        "held_ok": True,
    }
    assert s["ranks_ok"] is True
    # The top-level figures are the worst rank's.
    assert s["compile_peak_torch_compile_mib"] == 710.0


def test_one_rank_over_a_limit_or_missing_fails_the_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench, compiled = _compile_lane(tmp_path, monkeypatch, 2)
    compiled["report"]["ranks"]["1"]["allocated_at_aot_save_bytes"] = 65 * MIB
    s = bench.summarise(_runs(compiled, baked_s=30.0), 2)["qwen3-8b-dummy"]
    assert s["ranks"]["1"]["held_ok"] is False and s["ranks"]["0"]["held_ok"] is True
    assert s["ranks_ok"] is False
    assert s["speedup_ok"] is False
    del compiled["rank_files"]["1"]
    assert bench.summarise(_runs(compiled), 2)["qwen3-8b-dummy"]["every_rank_baked"] is False
    # A TP 2 result with one rank's report is not a TP 2 result.
    del compiled["report"]["ranks"]["1"]
    assert bench.summarise(_runs(compiled), 2)["qwen3-8b-dummy"]["ranks_ok"] is False
