"""The GPU harness that executes a rendered Dockerfile without Docker (bench/vllm_image_flow.py)
must read what ``render`` writes today: if the template changes shape, this fails on CPU
instead of during a device session."""

from __future__ import annotations

import io
import json
import re
import subprocess
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest

from kernelbake.contract.engines import VLLM
from kernelbake.contract.layout import CACHE_ROOT
from kernelbake.plan import plan
from kernelbake.render import render, write_context
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support import bench


def _flow() -> ModuleType:
    return bench.load("vllm_image_flow")


def _context(tmp_path: Path) -> Path:
    (target,) = plan(load_spec(REPO / "bench" / "specs" / "tiny-llama-ref.yaml"), ["h200"])
    wheel = tmp_path / "kernelbake-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not a real wheel")
    rendered = render(target, wheel=wheel.name)
    return write_context(rendered, tmp_path / "context", wheel)


def test_the_harness_reads_the_rendered_stages(tmp_path: Path) -> None:
    flow = _flow()
    stages = flow.stages(_context(tmp_path) / "Dockerfile")
    assert list(stages) == ["runtime", "compile", "caches", "cache-artifact", "final"]
    (run,) = [rest for word, rest in stages["compile"] if word == "RUN"]
    assert flow._flags(run) == ({"device": "nvidia.com/gpu=all"}, "python3 -m kernelbake compile")
    entrypoint = next(rest for word, rest in stages["final"] if word == "ENTRYPOINT")
    assert json.loads(entrypoint) == ["python3", "-m", "kernelbake", "serve"]


def test_the_harness_moves_the_bundle_like_the_cache_layers(tmp_path: Path) -> None:
    flow = _flow()
    context = _context(tmp_path)
    stages = flow.stages(context / "Dockerfile")
    compiled = tmp_path / "compile-fs"
    for kind in VLLM.cache_kinds:
        (compiled / CACHE_ROOT.lstrip("/") / kind.value).mkdir(parents=True)
    (compiled / CACHE_ROOT.lstrip("/") / "vllm" / "artifact").write_text("aot")
    (compiled / CACHE_ROOT.lstrip("/") / "manifest.json").write_text("{}")
    logs = tmp_path / "logs"
    logs.mkdir()
    record: list[dict[str, object]] = []

    runtime_env: dict[str, str] = {}
    runtime_fs = tmp_path / "runtime-fs"
    no_run = [(w, r) for w, r in stages["runtime"][1:] if w != "RUN"]
    flow.Stage(context, runtime_env, logs, record, runtime_fs).run("runtime", no_run, {})
    assert runtime_env["VLLM_CACHE_ROOT"] == f"{CACHE_ROOT}/vllm"
    assert (runtime_fs / "opt/kernelbake/target.json").read_text() == (context / "target.json").read_text()
    assert (runtime_fs / "models/tiny-llama-ref/config.json").is_file()

    staging = tmp_path / "caches-fs"
    staging.mkdir()
    flow.Stage(context, {}, logs, record, staging).run("caches", stages["caches"][1:], {"compile": compiled})
    final_fs = tmp_path / "final-fs"
    flow.Stage(context, {}, logs, record, final_fs).run("final", stages["final"][1:], {"caches": staging})
    root = final_fs / CACHE_ROOT.lstrip("/")
    assert (root / "vllm" / "artifact").read_text() == "aot"
    assert (root / "manifest.json").is_file()
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [k.value for k in VLLM.cache_kinds] + ["manifest.json"]
    )


def test_the_breakdown_splits_a_start_at_its_marks_in_order() -> None:
    flow = _flow()
    timeline = {
        "kernelbake_first_line": 0.2,
        "preflight_done": 1.9,
        "api_server_first_line": 9.0,
        "engine_core_first_line": 9.1,
        "model_loaded": 12.5,
        "torch_compile_done": 15.0,
        "graphs_captured": 19.5,
        "engine_init_done": 20.0,
        "api_server_listening": 20.3,
        "health_ok": 20.4,
    }
    parts = flow.breakdown(timeline)
    assert [p["segment"] for p in parts] == [name for name, *_ in flow.BREAKDOWN]
    # The segments tile launch..health: the preflight, which runs alongside, is not one of them.
    assert round(sum(p["s"] for p in parts), 2) == 20.4
    assert parts[1] == {
        "segment": "vllm_api_server_imports",
        "s": 8.8,
        "what": "vllm serve: imports, plugins, argument parsing",
    }
    # A start that never got so far has the segments it reached.
    assert [p["segment"] for p in flow.breakdown({"kernelbake_first_line": 0.2, "health_ok": None})] == [
        "kernelbake_start"
    ]


def test_the_marks_match_the_lines_they_stand_for() -> None:
    """Each mark is the text of a line vLLM 0.26 or kernelbake prints (from the H200 logs)."""
    flow = _flow()
    lines = {
        "kernelbake_first_line": "kernelbake serve: baked caches found (376 files, key sha256:ab): checking",
        "preflight_done": "kernelbake serve: preflight took 1.6 s, while the engine started",
        "api_server_first_line": "(APIServer pid=1603) INFO 12-01 09:13:49 [api_utils.py:345] ",
        "engine_prediction": "kernelbake: prediction from vLLM's own cache keys: HIT",
        "engine_core_first_line": "(EngineCore pid=1667) INFO 12-01 09:13:49 [core.py:116] Initializing",
        "model_loaded": "(EngineCore pid=1667) INFO [model_runner.py:305] Model loading took 1.65 GiB",
        "torch_compile_done": "(EngineCore pid=1667) INFO [monitor.py:53] torch.compile took 3.44 s in total",
        "graphs_captured": "(EngineCore pid=1667) INFO [model_runner.py:747] Graph capturing finished in 4 secs",
        "engine_init_done": "(EngineCore pid=1667) INFO [core.py:340] init engine (profile, create kv cache, "
        "warmup model) took 9.14 s",
        "api_server_listening": "(APIServer pid=1603) INFO [api_server.py:677] Starting vLLM server on http://",
        "forced_spawn": "WARNING We must use the `spawn` multiprocessing start method. Overriding",
    }
    assert set(lines) == set(flow.MARKS)
    for mark, line in lines.items():
        assert flow.MARKS[mark] in line, mark
    # The prediction line is the plugin's (kernelbake.runtime.prediction), not the supervisor's.
    assert not lines["engine_prediction"].startswith(flow.MARKS["kernelbake_first_line"])


def test_the_compile_hash_directory_is_read_from_vllms_lines() -> None:
    flow = _flow()
    build = (
        "INFO 12-01 09:11:19 [backends.py:1094] Using cache directory: "
        "/opt/kernelbake/cache/vllm/torch_compile_cache/cbcbf99e31/rank_0_0/backbone for vLLM's torch.compile"
    )
    serve = (
        "(EngineCore pid=1667) INFO 12-01 09:13:56 [decorators.py:311] Directly load AOT compilation from "
        "path /opt/kernelbake/cache/vllm/torch_compile_cache/torch_aot_compile/a3b0e6d9/rank_0_0/model"
    )
    assert flow.CACHE_DIR.findall(build + "\n" + serve) == [
        "/opt/kernelbake/cache/vllm/torch_compile_cache/cbcbf99e31",
        "/opt/kernelbake/cache/vllm/torch_compile_cache/torch_aot_compile/a3b0e6d9",
    ]


def test_importtime_rows_keep_self_time_and_depth() -> None:
    flow = _flow()
    stderr = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       120 |        120 |     _io\n"
        "import time:      2000 |       2300 |   vllm.env_override\n"
        "import time:       293 |    3060782 | vllm.entrypoints.cli.main\n"
        "not an import line\n"
    )
    assert flow._importtime_rows(stderr) == [
        (120, 120, 2, "_io"),
        (2000, 2300, 1, "vllm.env_override"),
        (293, 3060782, 0, "vllm.entrypoints.cli.main"),
    ]


def test_importtime_runs_the_api_server_imports_again_without_bytecode(tmp_path: Path) -> None:
    """The last run reads no .pyc: its bytecode prefix is an empty folder, made fresh."""
    flow = _flow()
    prefix = tmp_path / "pycache-empty"
    (prefix / "stale").mkdir(parents=True)
    calls: list[tuple[str, dict[str, str]]] = []

    def run(argv: list[str], env: dict[str, str], **kw: object) -> object:
        calls.append((argv[-1], env))
        assert not prefix.exists()
        return subprocess.CompletedProcess(argv, 0, "", "import time:  5 |  7 | vllm\n")

    real = flow.subprocess.run
    flow.subprocess.run = run
    try:
        out = flow.importtime({"TMPDIR": str(tmp_path)}, tmp_path)
    finally:
        flow.subprocess.run = real
    assert list(out) == [*flow.IMPORTS, "vllm_api_server_no_bytecode"]
    code, env = calls[-1]
    assert code == flow.IMPORTS["vllm_api_server"]
    assert env == {"TMPDIR": str(tmp_path), "PYTHONPYCACHEPREFIX": str(prefix)}
    assert all("PYTHONPYCACHEPREFIX" not in e for _, e in calls[:-1])
    assert out["vllm_api_server_no_bytecode"]["modules"] == 1


def test_the_summary_compares_cold_with_warm_and_the_tokens() -> None:
    flow = _flow()
    doc = {
        "compile_wall_s": 150.0,
        "compile_cache_dirs": ["/c/torch_compile_cache/aa"],
        "serve_cold": {"ready_s": 160.0, "kernelbake_lines": []},
        "serve_warm": {
            "ready_s": 25.0,
            "files_added_to_cache_root": [],
            "compile_cache_dirs": ["/c/torch_compile_cache/aa"],
            "kernelbake_lines": ["kernelbake serve: preflight took 1.6 s, while the engine started"],
        },
        "cold_generate": {"tokens": [1, 2]},
        "warm_generate": {"tokens": [1, 2]},
        "serve_warm_also": [
            {"env": "X=1", "ready_s": 30.0, "generate": {"tokens": [1, 3]}, "compile_cache_dirs": ["/c/x"]}
        ],
    }
    s = flow.summary(doc)
    assert s["speedup_ready"] == 6.4 and s["tokens_identical"] is True
    assert s["preflight_warm"] == ["kernelbake serve: preflight took 1.6 s, while the engine started"]
    assert s["compile_cache_dirs"] == {
        "build": ["/c/torch_compile_cache/aa"],
        "warm": ["/c/torch_compile_cache/aa"],
        "warm X=1": ["/c/x"],
    }
    assert s["warm_also"][0]["tokens_identical_to_warm"] is False
    doc["warm_generate"] = {"tokens": [9]}
    assert flow.summary(doc)["tokens_identical"] is False
    # vLLM's own verdict on each changed start, as check printed it.
    doc["check_shape_changed"] = {
        "rc": 6,
        "verdict": {
            "predicted": "miss",
            "notes": [],
            "prediction": {"reasons": ["vllm: model_config.max_model_len: 4096 → 2048"]},
        },
    }
    assert flow.summary(doc)["checks"] == {
        "check_shape_changed": {
            "rc": 6,
            "predicted": "miss",
            "reasons": ["vllm: model_config.max_model_len: 4096 → 2048"],
            "notes": [],
        }
    }


def test_the_table_has_a_column_per_start_and_a_row_per_segment() -> None:
    flow = _flow()
    start = {"ready_s": 2.0, "breakdown_s": flow.breakdown({"kernelbake_first_line": 0.5, "health_ok": 2.0})}
    text = flow.table({"models": {"m": {"serve_cold": start, "serve_warm": start, "serve_warm_also": []}}})
    lines = text.splitlines()
    assert lines[0] == "| segment | m, cold | m, baked |"
    assert lines[2] == "| kernelbake_start | 0.50 | 0.50 |"
    assert len(lines) == 2 + len(flow.BREAKDOWN) + 1 and lines[-1].endswith("**2.0** | **2.0** |")


def test_a_runs_bind_mount_is_its_own(tmp_path: Path) -> None:
    # Two flows on one machine once raced over the same bind target (/tmp/kernelbake-wheels):
    # each RUN now sees its own source there, as under BuildKit.
    import subprocess

    flow = _flow()
    target = tmp_path / "shared" / "kernelbake-wheels"
    outs = []
    for name in ("a", "b"):
        source = tmp_path / name
        source.mkdir()
        (source / f"{name}.whl").write_text(name)
        argv, links = flow.with_binds([(source, target)], f"ls {target}")
        outs.append(subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split())
        for link in links:
            link.unlink()
    assert outs == [["a.whl"], ["b.whl"]]
    if flow._own_mount_namespaces():
        # In a namespace of its own: nothing is left at the target for the other flow.
        assert not any(target.iterdir())


class _FakeServer:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, logs: Path):
        self.env, self.ready_s = env, 12.5
        _FakeServer.started.append(self)

    started: ClassVar[list[_FakeServer]] = []

    def generate(self, model: str) -> dict[str, object]:
        return {"tokens": [1, 2, 3]}

    def stop(self) -> dict[str, object]:
        return {"ready_s": self.ready_s, "breakdown_s": []}


def _rebake_setup(tmp_path: Path, flow: ModuleType, compile_run: object) -> tuple[Path, Path]:
    cache_root = tmp_path / "opt" / "cache"
    (cache_root / "vllm").mkdir(parents=True)
    (cache_root / "vllm" / "plain-artifact").write_text("plain")
    pinned = cache_root.parent / "pinned-manifest.json"
    pinned.write_text("plain manifest")
    flow.Stage.run = compile_run
    flow.Server = _FakeServer
    flow.wait_ready = lambda server, started, deadline: None
    return cache_root, pinned


def test_a_rebake_starts_its_own_bundle_and_puts_the_first_back(tmp_path: Path) -> None:
    """A compile factor is A/B'd by a second bundle, started with the factor set; the first
    bundle and its pinned manifest are what the rest of the run (and the report) sees after."""
    flow = _flow()
    seen: dict[str, object] = {}

    def compile_run(self: object, name: str, body: object, copy_from: object) -> None:
        root = tmp_path / "opt" / "cache"
        seen["empty_before"] = not root.exists()
        seen["env"] = dict(self.env)  # type: ignore[attr-defined]
        (root / "vllm").mkdir(parents=True)
        (root / "vllm" / "mega-artifact").write_text("mega")
        (root / "manifest.json").write_text('{"mega": true}')
        self.record.append({"stage": name, "log": "rebake1-0.log"})  # type: ignore[attr-defined]

    cache_root, pinned = _rebake_setup(tmp_path, flow, compile_run)
    _FakeServer.started.clear()
    mixed: list[tuple[object, ...]] = []

    def after_ready(
        server: object, model: str, dirs: object, at_launch: object, waves: object
    ) -> dict[str, object]:
        mixed.append((server, model, sorted(dirs), waves))  # type: ignore[call-overload]
        return {"request_mix": {"requests": 3}, "files_added_after_ready": {}}

    flow.after_ready = after_ready
    run_env = {"R": "s", "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp")}
    pinned_during: list[str] = []
    real_stop = _FakeServer.stop

    def stop(self: _FakeServer) -> dict[str, object]:
        pinned_during.append(pinned.read_text())
        return real_stop(self)

    _FakeServer.stop = stop  # type: ignore[method-assign]
    try:
        out = flow.rebake(
            "VLLM_USE_MEGA_AOT_ARTIFACT=1",
            1,
            tmp_path,
            {"compile": [("FROM", "runtime"), ("RUN", "x")]},
            cache_root,
            tmp_path,
            _args(),
            0.0,
            {"compile": {"A": "b"}, "run": run_env},
            ["serve"],
            "/models/m",
            {"tokens": [1, 2, 3]},
            ["the waves"],
        )
    finally:
        _FakeServer.stop = real_stop  # type: ignore[method-assign]
    assert seen["empty_before"] is True
    assert seen["env"] == {"A": "b", "VLLM_USE_MEGA_AOT_ARTIFACT": "1"}
    (server,) = _FakeServer.started
    assert server.env == {**run_env, "VLLM_USE_MEGA_AOT_ARTIFACT": "1"}
    # The rebaked start serves the baked start's request mix, watched in the same places.
    assert mixed == [(server, "/models/m", ["cache_root", "home", "tmp"], ["the waves"])]
    assert out["request_mix"] == {"requests": 3}
    # Serve's integrity check read the rebaked bundle's manifest, not the first one's.
    assert pinned_during == ['{"mega": true}']
    assert out["ready_s"] == 12.5 and out["tokens_identical_to_warm"] is True
    assert out["bundle_files"] == 2
    assert sorted(p.name for p in (cache_root / "vllm").iterdir()) == ["plain-artifact"]
    assert pinned.read_text() == "plain manifest"
    assert not cache_root.with_name("cache-plain").exists()


def test_a_failed_rebake_still_puts_the_first_bundle_back(tmp_path: Path) -> None:
    flow = _flow()

    def compile_run(self: object, name: str, body: object, copy_from: object) -> None:
        (tmp_path / "opt" / "cache" / "half").mkdir(parents=True)
        raise SystemExit("rebake1: RUN failed with 1")

    cache_root, pinned = _rebake_setup(tmp_path, flow, compile_run)
    out = flow.rebake(
        "X=1",
        1,
        tmp_path,
        {"compile": [("FROM", "runtime")]},
        cache_root,
        tmp_path,
        _args(),
        0.0,
        {"compile": {}, "run": {}},
        ["serve"],
        "/models/m",
        None,
        [],
    )
    assert out["failed"] == "rebake1: RUN failed with 1"
    assert sorted(p.name for p in cache_root.iterdir()) == ["vllm"]
    assert pinned.read_text() == "plain manifest"


def _args() -> object:
    import argparse

    return argparse.Namespace(deadline=1000.0, mix_total=3)


def test_a_context_for_either_hopper_names_the_same_model(tmp_path: Path) -> None:
    # The device lends an H100 when no H200 comes: both runs file their results under the spec's
    # name, not one of them under "tiny-llama-ref-h100".
    spec = load_spec(REPO / "bench" / "specs" / "vllm-0.32.0" / "tiny-llama-ref.yaml")
    wheel = tmp_path / "kernelbake-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not a real wheel")
    names = {}
    for target in plan(spec, ["h200", "h100"]):
        folder = tmp_path / f"{spec.name}-{target.gpu.name}" / "context"
        context = write_context(render(target, wheel=wheel.name), folder, wheel)
        names[target.gpu.name] = _flow().model_name(context)
    assert names == {"h200": "tiny-llama-ref", "h100": "tiny-llama-ref"}


def test_every_start_finds_the_cache_root_as_the_image_holds_it(tmp_path: Path) -> None:
    """vLLM 0.32's baked 8B start rewrote two Inductor autotune results in place (2026-12-05);
    the next start in the same root failed serve's integrity check and ran cold. A container of
    the image starts from the image's files, so the flow puts them back before each start."""
    import dataclasses

    flow = _flow()
    image, root = tmp_path / "image", tmp_path / "root"
    (image / "vllm" / "jd").mkdir(parents=True)
    (image / "vllm" / "jd" / "k.best_config").write_text('{"time_taken_ms": 10}')
    (image / "manifest.json").write_text("{}")
    (image / "gone.bin").write_bytes(b"x")
    flow.shutil.copytree(image, root, symlinks=True)
    fields = {f.name: None for f in dataclasses.fields(flow._Flow)}
    run = flow._Flow(**{**fields, "cache_root": root, "image_root": image})  # type: ignore[arg-type]
    assert flow.as_the_image(run) == []  # nothing changed: nothing copied
    (root / "vllm" / "jd" / "k.best_config").write_text('{"time_taken_ms": 9}')  # one byte less
    (root / "gone.bin").unlink()
    (root / "vllm" / "new.py").write_text("written by a start")
    assert flow.as_the_image(run) == ["gone.bin", "vllm/jd/k.best_config", "vllm/new.py"]
    assert flow._files(root) == flow._files(image)
    assert (root / "vllm" / "jd" / "k.best_config").read_text() == '{"time_taken_ms": 10}'


def _off_the_machine(
    flow: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    bake: Any = lambda *a, **k: (["kernelbake"], {}, {}),
) -> None:
    """``flow.flow`` with nothing done to this machine: no folder emptied or copied, no stage run
    (``bake`` answers for them), no check and no request mix."""
    monkeypatch.setattr(flow, "WORK", tmp_path / "work")
    monkeypatch.setattr(flow, "remove", lambda p: None)
    monkeypatch.setattr(flow, "empty", lambda p: None)
    monkeypatch.setattr(flow, "_bake", bake)
    monkeypatch.setattr(flow.shutil, "copytree", lambda *a, **k: None)
    monkeypatch.setattr(flow, "_check", lambda *a: {})
    monkeypatch.setattr(flow, "mix_plan", lambda *a: [])


def test_a_snapshot_model_starts_cold_last_unless_cold_first_and_a_baked_only_one_never(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The snapshot's phases follow the baked start at once, so that a take that fails shows
    itself before the cold start's minutes are spent; other models start cold first."""
    flow = _flow()
    context = _context(tmp_path)
    order: list[str] = []
    _off_the_machine(flow, monkeypatch, tmp_path)
    so_far = tmp_path / "out" / "model-so-far.json"

    def cold(*a: object) -> None:
        # What the snapshot's phases measured is on disk before the cold start's minutes.
        kept = json.loads(so_far.read_text()) if so_far.exists() else {}
        order.append(f"cold kept={kept.get('snapshot')}")

    monkeypatch.setattr(flow, "_cold_start", cold)
    monkeypatch.setattr(
        flow, "_baked_start", lambda *a, snapshot=False: order.append(f"baked snapshot={snapshot}")
    )

    def snapshot_phases(
        _m: object,
        _r: object,
        doc: dict[str, Any],
        _w: object,
        _c: object,
        asleep: str,
        so_far: Any,
        pages_probe_after_take: bool,
    ) -> None:
        # Each phase that ends is on disk before the next one starts (a lease taken back
        # mid-flow, 2026-12-07).
        doc.update(snapshot={"take": 1})
        so_far()
        kept = json.loads(so_far_file.read_text())["snapshot"]
        order.append(f"snapshot {asleep} probe={pages_probe_after_take} kept={kept}")
        doc.update(snapshot={"restores": 3})

    so_far_file = so_far
    monkeypatch.setattr(flow.snapshot_flow, "run", snapshot_phases)
    monkeypatch.setattr(flow, "_checks", lambda *a: order.append("checks"))
    monkeypatch.setattr(flow, "summary", lambda doc: {})

    def ran(*, snapshot: bool, baked_only: bool, cold_first: bool = False) -> list[str]:
        order.clear()
        a = flow.argparse.Namespace(
            baked_only=["m"] if baked_only else [],
            cold_first=["m"] if cold_first else [],
            snapshot=["m"] if snapshot else [],
            serve_args_for=[],
            serve_args=None,
            importtime=False,
            mix_total=0,
            criu="criu",
            snapshot_weights="beside",
            pages_probe=True,
            model_dir=None,
            caches_from=[],
            save_caches=[],
        )
        doc = flow.flow(context, tmp_path / "out", 0.0, a, False, "m")
        assert "failed" not in doc, doc
        return list(order)

    assert ran(snapshot=False, baked_only=False) == ["cold kept=None", "baked snapshot=False", "checks"]
    so_far.unlink()
    assert ran(snapshot=True, baked_only=False) == [
        "baked snapshot=True",
        "snapshot beside probe=True kept={'take': 1}",
        "cold kept={'restores': 3}",
        "checks",
    ]
    assert ran(snapshot=True, baked_only=True) == [
        "baked snapshot=True",
        "snapshot beside probe=True kept={'take': 1}",
        "checks",
    ]
    so_far.unlink()
    # --cold-first: a session whose first aim is the cold and baked starts has them before the
    # snapshot's phases.
    assert ran(snapshot=True, baked_only=False, cold_first=True) == [
        "cold kept=None",
        "baked snapshot=True",
        "snapshot beside probe=True kept={'take': 1}",
        "checks",
    ]
    assert ran(snapshot=True, baked_only=True, cold_first=True) == [
        "baked snapshot=True",
        "snapshot beside probe=True kept={'take': 1}",
        "checks",
    ]
    assert ran(snapshot=False, baked_only=True) == ["baked snapshot=False", "checks"]


def test_a_context_whose_wheel_is_not_this_tree_s_is_named_before_anything_runs(tmp_path: Path) -> None:
    """The context carries the wheel it was rendered with; one rendered before a runtime change
    would spend a device session on the old code."""
    flow = _flow()
    src = tmp_path / "src"
    (src / "kernelbake/runtime").mkdir(parents=True)
    (src / "kernelbake/__init__.py").write_text("")
    (src / "kernelbake/runtime/take.py").write_text("new = 1\n")
    (src / "kernelbake/runtime/__pycache__").mkdir()
    (src / "kernelbake/runtime/__pycache__/take.cpython-312.py").write_text("ignored\n")
    context = tmp_path / "context"
    (context / "wheels").mkdir(parents=True)
    with zipfile.ZipFile(context / "wheels/kernelbake-0.1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("kernelbake/__init__.py", "")
        whl.writestr("kernelbake/runtime/take.py", "old = 1\n")
        whl.writestr("kernelbake/runtime/gone.py", "")
        whl.writestr("kernelbake-0.1.0.dist-info/METADATA", "Name: kernelbake\n")
    assert flow.stale_wheel(context, src) == ["kernelbake/runtime/gone.py", "kernelbake/runtime/take.py"]
    (src / "kernelbake/runtime/take.py").write_text("old = 1\n")
    (src / "kernelbake/runtime/gone.py").write_text("")
    assert flow.stale_wheel(context, src) == []
    assert flow.stale_wheel(tmp_path, src) == ["no kernelbake wheel in the context"]


def _caches(root: Path, key: str, device: str) -> Path:
    (root / "vllm" / "h").mkdir(parents=True)
    (root / "vllm" / "h" / "artifact").write_bytes(b"aot")
    (root / "triton").mkdir()
    manifest = {"key": key, "compile_report": {"builder": {"device": device}, "wall_s": 640.8}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_a_caches_stage_saved_in_one_run_is_what_the_next_run_bakes_from(tmp_path: Path) -> None:
    """The FP8 MoE's compile is 8 to 11 minutes of a 30-minute device session: a run saves its
    caches stage (--save-caches) and a later one on the same GPU model bakes from it."""
    flow = _flow()
    staged = _caches(tmp_path / "stage", "kb1:k", "NVIDIA H100 80GB HBM3")
    saved = flow.pack_caches(staged, tmp_path / "caches.tar.xz")
    assert saved["bytes"] == (tmp_path / "caches.tar.xz").stat().st_size
    again = tmp_path / "again"
    again.mkdir()
    carried = flow.carried_caches(tmp_path / "caches.tar.xz", again, "kb1:k", "NVIDIA H100 80GB HBM3")
    assert flow._files(again) == flow._files(staged)
    assert (again / "vllm" / "h" / "artifact").read_bytes() == b"aot"
    assert carried["sha256"] == saved["sha256"]
    assert carried["compiled_on"] == {"device": "NVIDIA H100 80GB HBM3"}
    assert carried["compile_s_then"] == 640.8


@pytest.mark.parametrize(
    ("key", "gpu", "says"),
    [
        ("kb1:other", "NVIDIA H100 80GB HBM3", "compiled for 'kb1:k', this context's key is 'kb1:other'"),
        ("kb1:k", "NVIDIA H200", "compiled on 'NVIDIA H100 80GB HBM3', this machine has 'NVIDIA H200'"),
        ("kb1:k", "", "this machine has ''"),
    ],
)
def test_carried_caches_of_another_key_or_gpu_model_are_refused(
    tmp_path: Path, key: str, gpu: str, says: str
) -> None:
    flow = _flow()
    flow.pack_caches(_caches(tmp_path / "stage", "kb1:k", "NVIDIA H100 80GB HBM3"), tmp_path / "c.tar.xz")
    (tmp_path / "again").mkdir()
    with pytest.raises(SystemExit, match=re.escape(says)):
        flow.carried_caches(tmp_path / "c.tar.xz", tmp_path / "again", key, gpu)


def test_the_flow_hands_a_models_carried_and_saved_caches_to_the_bake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flow = _flow()
    context = _context(tmp_path)
    seen: list[dict[str, Any]] = []
    _off_the_machine(
        flow, monkeypatch, tmp_path, bake=lambda *a, **k: seen.append(k) or (["kernelbake"], {}, {})
    )
    monkeypatch.setattr(flow, "_baked_start", lambda *a, **k: None)
    monkeypatch.setattr(flow, "_checks", lambda *a: None)
    monkeypatch.setattr(flow, "summary", lambda doc: {})
    a = flow.argparse.Namespace(
        baked_only=["m", "n"],
        cold_first=[],
        snapshot=[],
        serve_args_for=[],
        serve_args=None,
        importtime=False,
        mix_total=0,
        model_dir=None,
        caches_from=["other=/x.tar.xz", "m=/carried/m.tar.xz"],
        save_caches=["n"],
    )
    flow.flow(context, tmp_path / "out", 0.0, a, False, "m")
    flow.flow(context, tmp_path / "out-n", 0.0, a, False, "n")
    assert seen == [
        {"carried": Path("/carried/m.tar.xz"), "save_caches": None},
        {"carried": None, "save_caches": tmp_path / "out-n" / "caches.tar.xz"},
    ]


def test_each_check_after_the_starts_reads_the_image_s_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The MoE's baked start rewrote two autotune results (2026-12-07, H100): the checks after
    it read that root and said cold. Each check now finds the root as the image holds it."""
    import dataclasses

    flow = _flow()
    image, root = tmp_path / "image", tmp_path / "root"
    (image / "inductor").mkdir(parents=True)
    (image / "inductor" / "k.best_config").write_text('{"time_taken_ms": 10}')
    flow.shutil.copytree(image, root)
    fields = {f.name: None for f in dataclasses.fields(flow._Flow)}
    a = flow.argparse.Namespace(skip_checks=False)
    run = flow._Flow(  # type: ignore[arg-type]
        **{**fields, "cache_root": root, "image_root": image, "a": a, "run_env": {}, "logs": tmp_path}
    )
    found: list[str] = []

    def check(*_a: object) -> dict[str, Any]:
        found.append((root / "inductor" / "k.best_config").read_text())
        # What a start (or a check) rewrites, the next check must not see.
        (root / "inductor" / "k.best_config").write_text('{"time_taken_ms": 9}')
        return {"rc": 0}

    monkeypatch.setattr(flow, "_check", check)
    (root / "inductor" / "k.best_config").write_text('{"time_taken_ms": 9}')
    doc: dict[str, Any] = {}
    flow._checks(run, ["kernelbake"], [], doc)
    assert found == ['{"time_taken_ms": 10}'] * 3
    assert doc["check_shape_changed"]["cache_root_put_back"] == ["inductor/k.best_config"]


@pytest.mark.parametrize("odd", ["../escape", "/abs", "link", "not a tar", "no manifest"])
def test_a_carried_tar_with_anything_but_files_and_folders_below_it_is_refused(
    tmp_path: Path, odd: str
) -> None:
    import tarfile

    flow = _flow()
    tar = tmp_path / "c.tar.xz"
    if odd == "not a tar":
        tar.write_bytes(b"half a download")
    else:
        with tarfile.open(tar, "w:xz") as tf:
            info = tarfile.TarInfo("vllm/x" if odd == "no manifest" else odd)
            if odd == "link":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tf.addfile(info, None if odd == "link" else io.BytesIO(b""))
    (tmp_path / "again").mkdir()
    with pytest.raises(SystemExit, match="not a caches stage"):
        flow.carried_caches(tar, tmp_path / "again", "kb1:k", "none")
    if odd != "no manifest":
        assert list((tmp_path / "again").iterdir()) == []
    assert not (tmp_path / "escape").exists()
