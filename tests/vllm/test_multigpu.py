"""Compile-only and preflight at tensor/pipeline parallelism above 1, with processes acting as
vLLM's ranks (tests/support/fake_ranks.py): per-rank collection, the manifest's rank entries,
per-rank memory in the compile report, and the preflight's check that every rank is baked."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from kernelbake.contract.manifest import Manifest, RankEntry
from kernelbake.contract.serve import ServeArgs
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput, BuildFailed
from kernelbake.plan import plan
from kernelbake.runner import Result
from kernelbake.runtime.bundle import read_manifest, write_manifest
from kernelbake.runtime.compile import stage as compile_step
from kernelbake.runtime.engines.vllm import VllmEngine
from kernelbake.runtime.engines.vllm.args import serve_flags
from kernelbake.runtime.engines.vllm.ranks import fold_ranks, rank_entries
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.serve import preflight as pf
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.fake_engine import pin_manifest, platform_for
from tests.support.fake_ranks import MIB, MultiRankCompileOnly, collective, vllm_layout

SPEC_TP4 = "images/llama-3.1-70b-instruct.yaml"


def _target(tmp_path: Path, spec: str = SPEC_TP4, **serve: int) -> TargetConfig:
    s = load_spec(REPO / spec)
    if serve:
        s = dataclasses.replace(s, serve=dataclasses.replace(s.serve, **serve))
    t = plan(s, ["h200"])[0]
    config = TargetConfig(
        key=t.key, gpu="h200", serve=s.serve, shapes=s.compile.shapes, cache_root=str(tmp_path / "cache")
    )
    (tmp_path / "target.json").write_text(config.to_json())
    return config


def _env(tmp_path: Path) -> RuntimeEnv:
    return RuntimeEnv.from_env(
        {"KERNELBAKE_UNSAFE_TARGET": str(tmp_path / "target.json"), "TMPDIR": str(tmp_path / "scratch")}
    )


def _engine(
    target: TargetConfig, runner: MultiRankCompileOnly, monkeypatch: pytest.MonkeyPatch
) -> VllmEngine:
    engine = VllmEngine(runner=runner)
    monkeypatch.setattr(engine, "probe", lambda: platform_for(target.key))
    monkeypatch.setattr(engine, "hashed_env_names", lambda: ("VLLM_X",))
    monkeypatch.setattr(compile_step.runtime_env, "apply", lambda variables: None)
    return engine


def _bake(tmp_path: Path, target: TargetConfig, monkeypatch: pytest.MonkeyPatch, **kw: object) -> Manifest:
    world = target.serve.tensor_parallel_size * target.serve.pipeline_parallel_size
    runner = MultiRankCompileOnly(world, target.serve.tensor_parallel_size, **kw)
    manifest = compile_step.run_compile(_env(tmp_path), engine=_engine(target, runner, monkeypatch))
    pin_manifest(tmp_path / "target.json")
    return manifest


# -- keys and flags ---------------------------------------------------------------------------


def test_specs_carry_their_parallel_sizes_into_the_key_and_vllms_argv(tmp_path: Path) -> None:
    dense = _target(tmp_path)
    assert (dense.key.tp, dense.key.pp, dense.key.ep) == (4, 1, 1)
    flags = serve_flags(dense.serve)
    assert flags[flags.index("--tensor-parallel-size") + 1] == "4"
    assert "--enable-expert-parallel" not in flags
    moe = _target(tmp_path, "images/qwen3-30b-a3b.yaml")
    assert (moe.key.tp, moe.key.pp, moe.key.ep) == (2, 1, 2)
    assert "--enable-expert-parallel" in serve_flags(moe.serve)
    # Each size is its own key: a TP 4 bundle is never taken for a TP 2 one.
    assert dense.key.replace(tp=2).digest != dense.key.digest
    pp = ServeArgs(tensor_parallel_size=2, pipeline_parallel_size=2)
    assert serve_flags(pp)[serve_flags(pp).index("--pipeline-parallel-size") + 1] == "2"


# -- compile: every rank's caches ---------------------------------------------------------------


def test_every_rank_is_baked_and_recorded_with_its_files_and_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _target(tmp_path)
    manifest = _bake(tmp_path, target, monkeypatch)
    assert [r.rank for r in manifest.ranks] == [0, 1, 2, 3]
    base = "vllm/torch_compile_cache"
    assert manifest.ranks[2].dirs == (
        f"{base}/67a6adfe44/rank_2_0",
        f"{base}/torch_aot_compile/{'a3b0e6d9' * 8}/rank_2_0",
    )
    # Each rank's own three files; the shared Inductor kernels and Triton belong to no rank.
    totals = manifest.rank_totals()
    assert {r: t["files"] for r, t in totals.items()} == {0: 3, 1: 3, 2: 3, 3: 3}
    assert manifest.totals()["vllm"]["files"] == 16
    owned = [f.path for f in manifest.files if any(r.holds(f.path) for r in manifest.ranks)]
    assert len(owned) == len(set(owned)) == 12
    report = dict(manifest.compile_report)
    assert report["ranks"]["3"] == {
        "tp_rank": 3,
        "pp_rank": 0,
        "dp_rank": 0,
        "peak_at_aot_save_bytes": 730 * MIB,
        "allocated_at_aot_save_bytes": 9 * MIB,
        "peak_after_aot_save_bytes": 403 * MIB,
        "allocated_at_end_bytes": 903 * MIB,
        "aot_saved": 1,
        "compiled_modules": 1,
        "fake_tensors": 291,
        "weights_mode": "fake",
    }
    # The top level holds the worst rank, where a single-GPU compile puts its own numbers.
    assert report["peak_at_aot_save_bytes"] == 730 * MIB
    assert report["allocated_at_aot_save_bytes"] == 9 * MIB
    assert report["weights_mode"] == "fake"
    # What is written is what is read back, rank entries and their derived counts included.
    on_disk = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    assert on_disk["ranks"][1] == {
        "rank": 1,
        "dirs": list(manifest.ranks[1].dirs),
        "files": 3,
        "bytes": totals[1]["bytes"],
    }
    assert read_manifest(tmp_path / "cache") == manifest


def test_pipeline_ranks_are_recorded_with_their_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _target(tmp_path, tensor_parallel_size=2, pipeline_parallel_size=2)
    manifest = _bake(tmp_path, target, monkeypatch)
    report = dict(manifest.compile_report)
    assert [(v["tp_rank"], v["pp_rank"]) for v in report["ranks"].values()] == [
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
    ]
    assert len(manifest.ranks) == 4


def test_a_rank_that_never_answers_fails_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _target(tmp_path)
    with pytest.raises(BuildFailed, match=r"ranks \[0, 1, 3\] answered, a world of 4 has ranks 0\.\.3"):
        _bake(tmp_path, target, monkeypatch, silent=[2])


def test_an_artifact_outside_its_ranks_directory_fails_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def renamed(vllm_root: Path, rank: int) -> tuple[list[Path], list[Path]]:
        files, _saved = vllm_layout(vllm_root, rank)
        moved = vllm_root / "torch_compile_cache" / "torch_aot_compile" / "h" / f"worker{rank}" / "model"
        return [*files, moved], [moved]

    with pytest.raises(BuildFailed, match=r"rank 0 saved .*/worker0/model, outside every rank_0_0 directory"):
        _bake(tmp_path, _target(tmp_path), monkeypatch, layout=renamed)


def test_ranks_that_left_no_files_beside_ranks_that_did_fail_the_build(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    answers = collective(2, 2, root / "vllm")
    for d in (root / "vllm").rglob("rank_1_0"):
        shutil.rmtree(d)
    answers[[a["rank"] for a in answers].index(1)]["aot_paths"] = []
    with pytest.raises(BuildFailed, match=r"rank\(s\) 1 left no torch\.compile files"):
        rank_entries(root, answers, 2)


def test_one_gpu_records_rank_0_and_keeps_its_own_numbers(tmp_path: Path) -> None:
    (answer,) = collective(1, 1, tmp_path / "cache" / "vllm")
    # At TP 1 the worker is the compile-only process: what it measured itself stays.
    report: dict[str, object] = {"peak_at_aot_save_bytes": 5}
    fold_ranks(report, [answer])
    assert report["peak_at_aot_save_bytes"] == 5
    assert report["peak_after_aot_save_bytes"] == 400 * MIB
    assert [e.rank for e in rank_entries(tmp_path / "cache", [answer], 1)] == [0]


# -- the manifest's rank entries ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        ({"rank": 0}, "ranks must be a list"),
        ([{"rank": -1, "dirs": ["vllm/x"]}], "rank -1 is not a non-negative integer"),
        ([{"rank": 0, "dirs": "vllm/x"}], "rank 0: dirs must be a list of paths"),
        ([{"rank": 0, "dirs": ["a"]}, {"rank": 0, "dirs": ["b"]}], "lists a rank twice"),
    ],
)
def test_malformed_rank_entries_are_bad_input(tmp_path: Path, ranks: object, message: str) -> None:
    target = _target(tmp_path)
    doc = json.loads(Manifest(key=target.key, files=(), ranks=(RankEntry(0, ("vllm/x",)),)).to_json())
    doc["ranks"] = ranks
    with pytest.raises(BadInput, match=message):
        Manifest.from_json(json.dumps(doc), source="m.json")


def test_a_manifest_without_ranks_keeps_its_bytes(tmp_path: Path) -> None:
    manifest = Manifest(key=_target(tmp_path).key, files=())
    assert "ranks" not in json.loads(manifest.to_json())
    assert Manifest.from_json(manifest.to_json()).ranks == ()


# -- preflight: every rank the serve arguments start --------------------------------------------


def test_a_bundle_with_every_rank_starts_warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _target(tmp_path)
    _bake(tmp_path, target, monkeypatch)
    verdict = pf.preflight(_env(tmp_path), engine=_engine(target, MultiRankCompileOnly(4, 4), monkeypatch))
    assert verdict.warm, verdict.problems


def _rewrite_without(root: Path, manifest: Manifest, dropped: set[int]) -> None:
    """The bundle a compile that missed ``dropped`` would have left: self-consistent, short."""
    for entry in manifest.ranks:
        if entry.rank in dropped:
            for d in entry.dirs:
                shutil.rmtree(root / d)
    write_manifest(
        root,
        manifest.key,
        {f.kind for f in manifest.files},
        hashed_env=dict(manifest.hashed_env),
        report=dict(manifest.compile_report),
        ranks=[r for r in manifest.ranks if r.rank not in dropped],
    )
    pin_manifest(root.parent / "target.json")  # the image such a build makes pins it


def test_a_missing_rank_starts_cold_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _target(tmp_path)
    root = tmp_path / "cache"
    _rewrite_without(root, _bake(tmp_path, target, monkeypatch), {2})
    verdict = pf.preflight(_env(tmp_path), engine=_engine(target, MultiRankCompileOnly(4, 4), monkeypatch))
    assert not verdict.warm
    assert verdict.problems == (
        "the bundle holds no caches for rank(s) 2 of the 4 that tensor_parallel_size=4 x "
        "pipeline_parallel_size=1 starts (it holds rank(s) 0, 1, 3); rebuild the image with this "
        "kernelbake at these parallel sizes",
    )
    assert verdict.cache_root != root


def test_a_bundle_that_records_no_ranks_starts_cold_at_tp_above_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _target(tmp_path)
    root = tmp_path / "cache"
    _rewrite_without(root, _bake(tmp_path, target, monkeypatch), {0, 1, 2, 3})
    verdict = pf.preflight(_env(tmp_path), engine=_engine(target, MultiRankCompileOnly(4, 4), monkeypatch))
    assert verdict.problems[0].startswith("the bundle holds no caches for rank(s) 0, 1, 2, 3 of the 4")
    assert "(it holds rank(s) none)" in verdict.problems[0]


# -- vLLM's CPU build: no per-rank artifacts ----------------------------------------------------


class _CpuCompileOnly:
    """vLLM's CPU build at one rank: AOT compile off, so everything it bakes is in Inductor's
    shared cache, and rank 0 answers without a directory of its own."""

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **_: object) -> Result:
        assert env is not None and env["VLLM_USE_AOT_COMPILE"] == "0"
        graph = Path(env["TORCHINDUCTOR_CACHE_DIR"]) / "fxgraph" / "g"
        graph.parent.mkdir(parents=True, exist_ok=True)
        graph.write_bytes(b"graph")
        report: dict[str, object] = {"hashed_env": {"VLLM_X": "1"}, "wall_s": 1.0}
        fold_ranks(report, [{"rank": 0, "dp_rank": 0, "tp_rank": 0, "pp_rank": 0, "aot_paths": []}])
        Path(argv[argv.index("--report") + 1]).write_text(json.dumps(report))
        return Result(tuple(argv), 0)


def test_the_cpu_build_records_no_rank_entries_and_its_bundle_starts_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = load_spec(REPO / "images/tiny-llama.yaml")
    t = plan(s, ["cpu"])[0]
    target = TargetConfig(key=t.key, gpu="cpu", serve=s.serve, shapes=(), cache_root=str(tmp_path / "cache"))
    (tmp_path / "target.json").write_text(target.to_json())
    engine = _engine(target, _CpuCompileOnly(), monkeypatch)  # type: ignore[arg-type]
    manifest = compile_step.run_compile(_env(tmp_path), engine=engine)
    pin_manifest(tmp_path / "target.json")
    assert manifest.ranks == ()
    verdict = pf.preflight(_env(tmp_path), engine=engine)
    assert verdict.warm, verdict.problems
