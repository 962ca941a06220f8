"""The vLLM engine's CPU-testable parts: flag mapping, evidence, env pinning, compile driver.

vLLM itself only runs on the GPU machine (bench/vllm_coldstart.py); these tests cover what
decides whether the compile-time and serve-time configurations hash alike.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from kernelbake.contract.engines import VLLM, VLLM_PINNED_HASHED_ENV
from kernelbake.contract.layout import CacheKind
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BuildFailed, KeyMismatch
from kernelbake.plan import plan
from kernelbake.runner import Result
from kernelbake.runtime.engines.vllm import APPENDED_LOGS, VllmEngine, compat_layer, compile_argv
from kernelbake.runtime.engines.vllm.args import serve_argv, serve_flags, shape_overrides
from kernelbake.runtime.engines.vllm.evidence import LogEvidence, Signal, added, snapshot
from kernelbake.runtime.engines.vllm.plugin import WEIGHTS_ENV
from kernelbake.spec import load_spec
from tests.conftest import REPO


def _target(spec: str = "images/qwen3-8b.yaml", gpu: str = "h100") -> TargetConfig:
    s = load_spec(REPO / spec)
    t = plan(s, [gpu])[0]
    return TargetConfig(key=t.key, gpu=gpu, serve=s.serve, shapes=s.compile.shapes)


def test_serve_flags_carry_every_hashed_serve_argument() -> None:
    t = _target()
    argv = serve_argv(t.key.model_path, t.serve)
    assert argv[:3] == ["vllm", "serve", "/models/qwen3-8b"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--dtype"] == "bfloat16"
    assert flags["--max-model-len"] == "32768"
    assert flags["--max-num-batched-tokens"] == "8192"
    assert flags["--max-num-seqs"] == "256"
    assert json.loads(flags["--compilation-config"]) == {"cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert "--quantization" not in argv


def test_quantization_and_extra_args_are_passed_through() -> None:
    t = _target("images/gpt-oss-20b.yaml")
    flags = serve_flags(t.serve)
    assert flags[flags.index("--quantization") + 1] == "mxfp4"
    assert serve_argv(t.key.model_path, t.serve, ["--port", "9000"])[-3:] == [
        "--async-scheduling",
        "--port",
        "9000",
    ]


def test_compile_only_gets_exactly_the_serve_flags() -> None:
    """The compile-time config hashes like the serve-time one only if the flags are equal."""
    t = _target()
    argv = compile_argv(t)
    assert argv[argv.index("--") + 1 :] == serve_argv(t.key.model_path, t.serve)[2:]


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        (["--port", "8000", "--served-model-name", "x"], []),
        # Outside vLLM's compile hash: the baked start on the H200 used these and hit.
        (
            [
                "--load-format",
                "dummy",
                "--gpu-memory-utilization",
                "0.3",
                "--kv-cache-memory-bytes",
                "2147483648",
            ],
            [],
        ),
        (["--max-model-len", "32768"], []),
        (["--max-model-len=4096"], ["--max-model-len 4096 changes the max_model_len"]),
        (["-tp", "2"], ["-tp 2 changes the tensor parallel size"]),
        (["--enforce-eager"], ["--enforce-eager changes the eager mode (no compiled graphs at all)"]),
        (
            ["--dtype", "bfloat16", "--kv-cache-dtype", "fp8"],
            ["--kv-cache-dtype fp8 changes the KV cache dtype"],
        ),
    ],
)
def test_shape_overrides(user: list[str], expected: list[str]) -> None:
    assert shape_overrides(user, _target().serve) == expected


def test_log_evidence_from_vllm_lines() -> None:
    baked = [
        "INFO [backends.py:292] Directly load the compiled graph(s) for compile range (1, 16384) from the cache, took 1.092 s",
        "INFO [decorators.py:311] Directly load AOT compilation from path /opt/kernelbake/cache/vllm/x/model",
        "INFO [monitor.py:53] torch.compile took 3.19 s in total",
    ]
    ev = LogEvidence().feed_all(baked)
    assert ev.torch_compile_hit is True
    assert ev.counts == {Signal.GRAPH_LOADED: 1, Signal.AOT_LOADED: 1}
    cold = ["INFO [backends.py:393] Compiling a graph for compile range (1, 16384) takes 9.99 s", baked[2]]
    assert LogEvidence().feed_all(cold).torch_compile_hit is False
    assert LogEvidence().feed_all(["nothing about compilation"]).torch_compile_hit is None
    failed = [baked[1], "WARNING Compiling model again due to a load failure from /x, reason: boom"]
    assert LogEvidence().feed_all(failed).torch_compile_hit is False


def test_cache_dir_snapshots_count_what_a_start_added(tmp_path: Path) -> None:
    dirs = {"triton": tmp_path / "triton", "vllm": tmp_path / "vllm"}
    (dirs["triton"] / "a").mkdir(parents=True)
    (dirs["triton"] / "a" / "k.cubin").write_bytes(b"x")
    before = snapshot(dirs)
    (dirs["triton"] / "b").mkdir()
    (dirs["triton"] / "b" / "k2.cubin").write_bytes(b"y")
    assert added(before, snapshot(dirs)) == {"triton": {"b/k2.cubin"}, "vllm": set()}


def test_serve_forks_the_engine_core_and_that_is_no_hashed_variable() -> None:
    assert VllmEngine().launch_env() == {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    # Neither pinned into the hash nor among the variables kernelbake hashes for vLLM: a
    # baked image's manifest never lists it, so serve's own env check stays quiet.
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in VLLM_PINNED_HASHED_ENV
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in VLLM.hashed_env
    assert "VLLM_WORKER_MULTIPROC_METHOD" not in VLLM.cache_env(Path("/opt/kernelbake/cache"))


def test_a_tree_to_be_snapshotted_spawns_its_engine_core() -> None:
    """Forked, the engine core inherits the API server's NVML files, which the driver's
    checkpoint leaves open and CRIU cannot dump (H100, vLLM 0.32): spawned, it has none."""
    assert VllmEngine().snapshot_env() == {
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_HOST_IP": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": "lo",
    }


def test_flashinfers_jit_log_is_declared_a_log_by_the_compile(tmp_path: Path) -> None:
    result = VllmEngine(runner=_FakeCompileOnly(fail=set())).compile(
        _target(), tmp_path / "cache", environ={"HOME": "/root"}
    )
    assert result.logs == APPENDED_LOGS
    assert "flashinfer_jit.log" in APPENDED_LOGS


def test_cache_env_points_every_kind_into_the_bundle_and_pins_process_dependent_defaults() -> None:
    root = Path("/opt/kernelbake/cache")
    env = VLLM.cache_env(root)
    assert env["VLLM_CACHE_ROOT"] == "/opt/kernelbake/cache/vllm"
    assert env["TRITON_CACHE_DIR"] == "/opt/kernelbake/cache/triton"
    assert env["FLASHINFER_WORKSPACE_BASE"] == "/opt/kernelbake/cache/flashinfer"
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/opt/kernelbake/cache/inductor"
    # Independent of the bundle root, so a relocated torch.compile cache still hashes alike.
    assert VLLM.cache_env(Path("/elsewhere/cache"))["VLLM_CONFIG_ROOT"] == env["VLLM_CONFIG_ROOT"]
    assert VLLM_PINNED_HASHED_ENV.items() <= env.items()
    covered = {Path(v).name for k, v in env.items() if v.startswith(str(root))}
    assert {k.value for k in VLLM.cache_kinds} <= covered


class _FakeCompileOnly:
    """Stands in for the compile-only subprocess: fails for the weight modes listed."""

    def __init__(self, fail: set[str]) -> None:
        self.fail = fail
        self.calls: list[tuple[str, Mapping[str, str]]] = []

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **_: object) -> Result:
        assert env is not None
        if list(argv[:2]) == ["vllm", "compile"]:
            self.calls.append(("native", env))
            return Result(tuple(argv), 0)
        mode = env[WEIGHTS_ENV]
        self.calls.append((mode, env))
        if mode in self.fail:
            return Result(tuple(argv), 1)
        report = Path(argv[argv.index("--report") + 1])
        report.write_text(
            # compile_only resolves ``auto`` by asking vLLM; a dense model gets fake weights.
            json.dumps(
                {
                    "weights_mode": {"auto": "fake"}.get(mode, mode),
                    "hashed_env": {"VLLM_X": "1"},
                    "wall_s": 1.0,
                    "junk": 1,
                }
            )
        )
        return Result(tuple(argv), 0)


def test_compile_uses_fake_weights_and_the_bundle_env(tmp_path: Path) -> None:
    fake = _FakeCompileOnly(fail=set())
    result = VllmEngine(runner=fake).compile(_target(), tmp_path / "cache", environ={"HOME": "/root"})
    assert [m for m, _ in fake.calls] == ["auto"]
    env = fake.calls[0][1]
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton")
    assert env["HOME"] == "/root"
    assert result.report == {"weights_mode": "fake", "wall_s": 1.0}
    assert result.hashed_env == {"VLLM_X": "1"}
    assert CacheKind.FLASHINFER in result.kinds
    assert all((tmp_path / "cache" / k.value).is_dir() for k in result.kinds)


def test_compile_never_records_a_startup_plan(tmp_path: Path) -> None:
    """A plan profiled under fake weights would size every baked start's KV cache for a GPU
    without the model on it; the image's environment cannot turn it on for compile-only."""
    fake = _FakeCompileOnly(fail=set())
    target = _target()
    VllmEngine(runner=fake).compile(target, tmp_path / "cache", environ={"VLLM_ENABLE_STARTUP_PLAN": "1"})
    assert fake.calls[0][1]["VLLM_ENABLE_STARTUP_PLAN"] == "0"


def test_compile_falls_back_to_uninitialised_weights_then_fails_clearly(tmp_path: Path) -> None:
    fake = _FakeCompileOnly(fail={"auto"})
    result = VllmEngine(runner=fake).compile(_target(), tmp_path / "cache", environ={})
    assert [m for m, _ in fake.calls] == ["auto", "empty"]
    assert result.report["weights_mode"] == "empty"
    with pytest.raises(BuildFailed, match="fake and with uninitialised weights"):
        VllmEngine(runner=_FakeCompileOnly(fail={"auto", "empty"})).compile(
            _target(), tmp_path / "c2", environ={}
        )


def test_unsupported_vllm_version_fails_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelbake.runtime import probe

    monkeypatch.setattr(probe, "dist_version", lambda name: "0.31.2")
    with pytest.raises(
        KeyMismatch, match=r"vllm 0\.31\.2: .* supports vLLM 0\.26\.0 \(cuda\), 0\.32\.0 \(cpu, cuda\)"
    ):
        compat_layer.patches_for_installed_vllm()


def test_native_compile_is_detected_only_when_vllm_ships_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert compat_layer.native_compile_available() is False
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: object() if name == "vllm.entrypoints.cli.compile" else None
    )
    assert compat_layer.native_compile_available() is True


def test_native_vllm_compile_runs_first_when_available(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat_layer, "native_compile_available", lambda: True)
    fake = _FakeCompileOnly(fail=set())
    VllmEngine(runner=fake).compile(_target(), tmp_path / "cache", environ={})
    assert [m for m, _ in fake.calls] == ["native", "auto"]


def test_serve_watcher_reports_each_kind_of_evidence_once(tmp_path: Path) -> None:
    watch = VllmEngine().serve_watcher(tmp_path)
    lines = [
        "INFO [decorators.py:311] Directly load AOT compilation from path /opt/kernelbake/cache/vllm/x/model",
        "INFO [decorators.py:311] Directly load AOT compilation from path /opt/kernelbake/cache/vllm/y/model",
        "INFO [monitor.py:53] torch.compile took 3.19 s in total",
        "WARNING Compiling model again due to a load failure from /x, reason: EOF",
    ]
    reports = [r for r in map(watch, lines) if r]
    assert len(reports) == 2
    assert reports[0].startswith(
        "cache HIT: vLLM loaded the baked torch.compile artifact (INFO [decorators.py"
    )
    assert reports[1].startswith("WARNING: vLLM could not load the baked artifact")


# As vLLM 0.26's API server logs it (bench/results/vllm-0.26.0-h200-image-flow/run2 logs).
_READY = "(APIServer pid=1548) INFO:     Application startup complete."


def test_once_ready_the_watcher_reports_what_start_up_added_to_each_cache(tmp_path: Path) -> None:
    baked = tmp_path / "triton" / "abc" / "kernel.cubin"
    baked.parent.mkdir(parents=True)
    baked.write_text("baked")
    watch = VllmEngine().serve_watcher(tmp_path)
    # Written during start-up: a kernel the bundle lacked, and one FlashInfer module.
    (tmp_path / "triton" / "def").mkdir()
    (tmp_path / "triton" / "def" / "_temperature_kernel.json").write_text("{}")
    (tmp_path / "flashinfer" / "sampling").mkdir(parents=True)
    (tmp_path / "flashinfer" / "sampling" / "sampling.so").write_text("")
    report = watch(_READY)
    assert report == (
        "WARNING: start-up compiled what the caches lacked: new files in triton 1, flashinfer 1; "
        "the preflight notes above say why, if they know"
    )
    assert watch(_READY) is None


def test_a_start_that_compiled_nothing_says_so_for_every_kind(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "model").write_text("aot")
    watch = VllmEngine().serve_watcher(tmp_path)
    report = watch(_READY)
    assert report is not None
    assert report.startswith("start-up compiled nothing: 0 new files in vllm, ")
    assert all(k.value in report for k in VLLM.cache_kinds)


def test_baked_files_a_start_rewrites_with_the_same_bytes_are_not_compiles(tmp_path: Path) -> None:
    # vLLM 0.26 on the H200 rewrites baked files (lock files, same bytes) at every start: the
    # watcher compares them with the manifest's sha256 rather than count them as compiled.
    import hashlib
    import os

    lock = tmp_path / "vllm" / "locks" / "x.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    module = tmp_path / "vllm" / "graph.py"
    module.write_text("baked")
    files = [
        {
            "path": p.relative_to(tmp_path).as_posix(),
            "size": p.stat().st_size,
            "kind": "vllm",
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
        }
        for p in (lock, module)
    ]
    (tmp_path / "manifest.json").write_text(json.dumps({"files": files}))
    watch = VllmEngine().serve_watcher(tmp_path)
    lock.write_text("")
    os.utime(lock, ns=(5, 5))
    report = watch(_READY)
    assert report is not None and report.startswith("start-up compiled nothing"), report
    # Regenerated with other bytes: that is a compile.
    watch = VllmEngine().serve_watcher(tmp_path)
    module.write_text("regenerated")
    os.utime(module, ns=(6, 6))
    report = watch(_READY)
    assert report is not None and "new files in vllm 1" in report, report


def test_key_fields_come_from_the_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelbake.contract.compat import check
    from kernelbake.runtime import probe

    versions = {"vllm": "0.26.0", "torch": "2.11.0", "triton": "3.6.0", "flashinfer-python": "0.6.14"}
    monkeypatch.setattr(probe, "dist_version", versions.__getitem__)
    asked: list[object] = []
    monkeypatch.setattr(
        probe, "cuda_device", lambda runner: asked.append(runner) or ("NVIDIA H100 PCIe", "sm_90a", "13.0")
    )
    monkeypatch.setattr(probe, "nvidia_driver", lambda: "570.86.10")
    monkeypatch.setattr(probe, "python_version", lambda: "3.12")
    runner = _FakeCompileOnly(fail=set())
    platform = VllmEngine(runner=runner).probe()
    # The GPU is asked through the engine's runner (the one function that runs subprocesses,
    # injected): the GPU harness asks it with this tree's kernelbake on the child's path.
    assert asked == [runner]
    software = platform.software
    assert software.engine_version == "0.26.0" and software.flashinfer == "0.6.14" and software.cuda == "13.0"
    assert platform.driver == "570.86.10"
    target = _target()  # planned for an H100 SXM
    match = check(target.key, platform)
    assert [r.field for r in match.blocking] == ["device", "driver_floor"]
    assert "NVIDIA H100 PCIe" in str(match.blocking[0])


class _WritesCaches(_FakeCompileOnly):
    """A compile-only that leaves files where vLLM would, under the env it was given."""

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kw: object) -> Result:
        assert env is not None
        for var, name in (
            ("VLLM_CACHE_ROOT", "torch_compile_cache/x/model"),
            ("TRITON_CACHE_DIR", "abc/k.cubin"),
        ):
            p = Path(env[var]) / name
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"kernel")
        return super().__call__(argv, env=env, **kw)


def test_compile_step_collects_the_caches_into_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from kernelbake.runtime.bundle import read_manifest
    from kernelbake.runtime.compile import stage as compile_step
    from kernelbake.runtime.env import RuntimeEnv
    from tests.support.fake_engine import platform_for

    target = dataclasses.replace(_target(), cache_root=str(tmp_path / "cache"))
    (tmp_path / "target.json").write_text(target.to_json())
    engine = VllmEngine(runner=_WritesCaches(fail=set()))
    monkeypatch.setattr(engine, "probe", lambda: platform_for(target.key, driver="580.95.05"))
    monkeypatch.setattr(engine, "hashed_env_names", lambda: ("VLLM_LOGGING_LEVEL", "VLLM_X"))
    monkeypatch.setattr(compile_step.runtime_env, "apply", lambda variables: None)
    manifest = compile_step.run_compile(
        RuntimeEnv.from_env({"KERNELBAKE_UNSAFE_TARGET": str(tmp_path / "target.json"), "VLLM_X": "1"}),
        engine=engine,
    )
    assert manifest.totals() == {"triton": {"files": 1, "bytes": 6}, "vllm": {"files": 1, "bytes": 6}}
    assert dict(manifest.hashed_env) == {"VLLM_LOGGING_LEVEL": "<unset>", "VLLM_X": "1"}
    report = dict(read_manifest(tmp_path / "cache").compile_report)
    assert report["builder"]["device"] == "NVIDIA H100 80GB HBM3"
    assert report["weights_mode"] == "fake"


def test_serve_gates_vllm_only_when_vllm_will_call_our_plugin() -> None:
    from kernelbake.runtime.engines.vllm import VllmEngine

    # The installed kernelbake registers the plugin; VLLM_PLUGINS is vLLM's allow-list.
    engine = VllmEngine()
    assert engine.holds_at_gate({})
    assert engine.holds_at_gate({"VLLM_PLUGINS": "other,kernelbake"})
    assert not engine.holds_at_gate({"VLLM_PLUGINS": "other"})
    assert not engine.holds_at_gate({"VLLM_PLUGINS": ""})
