"""Recording Triton first launches at build and preloading them at serve
(``engines.vllm.launches``), against stand-ins for Triton's and vLLM's module surfaces that
have the shapes Triton 3.6 and vLLM 0.26 give them (this host has neither on a GPU). What the
H200 shows with the real ones is in bench/results/vllm-0.26.0-h200-moe/README.md."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from kernelbake.runtime.engines.vllm import launches


class JITFunction:
    """Triton's JITFunction as preload sees it: per-device caches, ``fn``, ``preload``."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.device_caches: dict[int, tuple[dict[str, object], dict[str, object]]] = {0: ({}, {})}
        self.preloaded: list[str] = []

    def preload(self, data: str) -> object:
        key = json.loads(data)["key"]
        if key == "broken":
            raise RuntimeError("cannot deserialize")
        self.preloaded.append(key)
        self.device_caches[0][0][key] = object()
        return self.device_caches[0][0][key]


class Autotuner:
    def __init__(self, fn: JITFunction) -> None:
        self.fn = fn


def _kernel() -> None:  # the Python function a @triton.jit kernel wraps
    pass


@pytest.fixture
def triton(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    knobs = types.SimpleNamespace(runtime=types.SimpleNamespace(jit_post_compile_hook=None))
    driver = types.SimpleNamespace(active=types.SimpleNamespace(get_current_device=lambda: 0))
    mods = {
        "triton": types.ModuleType("triton"),
        "triton.runtime": types.ModuleType("triton.runtime"),
        "triton.runtime.jit": types.ModuleType("triton.runtime.jit"),
        "triton.runtime.driver": types.ModuleType("triton.runtime.driver"),
    }
    mods["triton"].knobs = knobs  # type: ignore[attr-defined]
    mods["triton.runtime.jit"].JITFunction = JITFunction  # type: ignore[attr-defined]
    mods["triton.runtime.driver"].driver = driver  # type: ignore[attr-defined]
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    return types.SimpleNamespace(knobs=knobs)


@pytest.fixture
def engine_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A vLLM module with one plain and one autotuned kernel."""
    mod = types.ModuleType("vllm.kb_test_kernels")
    plain, tuned = JITFunction(_kernel), JITFunction(_kernel)
    mod.plain = plain  # type: ignore[attr-defined]
    mod.tuned = Autotuner(tuned)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.kb_test_kernels", mod)
    return mod


def _hook_call(fn: Any, key: str) -> dict[str, Any]:
    # Triton 3.6's JITFunction._call_hook: fn=JitFunctionInfo(module, name, jit_function),
    # compile={"key": key, **kwargs with "specialization_data"}.
    data = json.dumps({"name": "k", "key": key})
    info = types.SimpleNamespace(module=fn.fn.__module__, name="k", jit_function=fn)
    return {"key": key, "fn": info, "compile": {"key": key, "specialization_data": data}}


def _line(module: str, qualname: str, key: str) -> str:
    return json.dumps({"module": module, "qualname": qualname, "key": key, "data": json.dumps({"key": key})})


def test_first_launches_are_recorded_once_each_and_the_monitor_still_hears_them(
    tmp_path: Path, triton: types.SimpleNamespace
) -> None:
    heard: list[str] = []
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: heard.append(kw["key"])
    path = tmp_path / "vllm" / launches.RECORD
    launches.record(path)
    hook = triton.knobs.runtime.jit_post_compile_hook
    kernel = JITFunction(_kernel)
    for key in ("k1", "k2", "k1"):
        hook(**_hook_call(kernel, key))
    hook(key="k3", fn=None, compile={"key": "k3"})  # a call without what preload needs
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [x["key"] for x in lines] == ["k1", "k2"]
    assert lines[0]["module"] == __name__ and lines[0]["qualname"] == "_kernel"
    assert json.loads(lines[0]["data"])["key"] == "k1"
    assert heard == ["k1", "k2", "k1", "k3"]


def test_preload_loads_each_recorded_specialisation_and_names_what_it_cannot(
    tmp_path: Path, triton: types.SimpleNamespace, engine_module: types.ModuleType
) -> None:
    engine_module.plain.device_caches[0][0]["there"] = object()
    path = tmp_path / "record.jsonl"
    path.write_text(
        "\n".join(
            [
                _line("vllm.kb_test_kernels", "plain", "a"),
                _line("vllm.kb_test_kernels", "plain", "a"),  # recorded twice (two ranks)
                _line("vllm.kb_test_kernels", "plain", "there"),
                _line("vllm.kb_test_kernels", "tuned", "b"),
                _line("vllm.kb_test_kernels", "plain", "broken"),
                _line("vllm.kb_test_kernels", "missing", "c"),
                _line("os", "getcwd", "d"),  # loaded, but no Triton kernel
                _line("not_the_engine.kernels", "k", "e"),  # never imported by name
                "{not json",
            ]
        )
        + "\n"
    )
    result = launches.preload(path)
    assert (result.loaded, result.present) == (2, 1)
    assert engine_module.plain.preloaded == ["a"] and engine_module.tuned.fn.preloaded == ["b"]
    failed = "\n".join(result.failed)
    assert len(result.failed) == 5
    assert "plain: RuntimeError: cannot deserialize" in failed
    assert "missing: AttributeError" in failed
    assert "os.getcwd: TypeError" in failed
    assert "not_the_engine.kernels.k: LookupError" in failed
    assert f"{path}:9: not a recorded launch" in failed
    assert "2 Triton kernel specialisations" in result.line() and "5 failed" in result.line()


def test_no_record_preloads_nothing_and_imports_nothing(tmp_path: Path) -> None:
    assert launches.preload(tmp_path / "none.jsonl") == launches.Preloaded(0, 0, (), 0.0)
    assert launches.record_at_serve({"VLLM_CACHE_ROOT": str(tmp_path)}) is None
    assert launches.record_at_serve({}) is None
    assert launches.record_at_serve({"VLLM_CACHE_ROOT": ""}) is None
    (tmp_path / launches.RECORD).parent.mkdir(parents=True)
    (tmp_path / launches.RECORD).write_text("")
    assert launches.record_at_serve({"VLLM_CACHE_ROOT": str(tmp_path)}) == tmp_path / launches.RECORD


@pytest.fixture
def jit_monitor(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    mod = types.ModuleType("vllm.utils.jit_monitor")
    calls: list[str] = []
    state = {"active": False}

    def activate(*, mode: str = "warn", verbose: bool = False) -> None:
        calls.append(f"activate {mode}")
        state["active"] = True

    mod.activate = activate  # type: ignore[attr-defined]
    mod.is_active = lambda: state["active"]  # type: ignore[attr-defined]
    mod.calls = calls  # type: ignore[attr-defined]
    utils = types.ModuleType("vllm.utils")
    utils.jit_monitor = mod  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", sys.modules.get("vllm", types.ModuleType("vllm")))
    monkeypatch.setitem(sys.modules, "vllm.utils", utils)
    monkeypatch.setitem(sys.modules, "vllm.utils.jit_monitor", mod)
    _as_vllm_0_26(monkeypatch)
    return mod


def _as_vllm_0_26(monkeypatch: pytest.MonkeyPatch) -> None:
    """launches reaches vLLM through the installed release's adapter: 0.26's, here."""
    from kernelbake.runtime.engines.vllm import _v0_26, compat_layer

    monkeypatch.setattr(compat_layer, "lookups", lambda: _v0_26.LOOKUPS)
    monkeypatch.setattr(compat_layer, "installed_vllm", lambda: ("vllm", "0.26.0"))


def test_serve_preloads_before_vllm_activates_its_monitor_and_only_once(
    tmp_path: Path,
    triton: types.SimpleNamespace,
    engine_module: types.ModuleType,
    jit_monitor: types.ModuleType,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "record.jsonl"
    path.write_text(_line("vllm.kb_test_kernels", "plain", "a") + "\n")
    order = jit_monitor.calls
    real = launches.preload

    def preload_seen(p: Path) -> launches.Preloaded:
        order.append(f"preload, monitor active: {jit_monitor.is_active()}")
        return real(p)

    monkeypatch.setattr(launches, "preload", preload_seen)
    assert launches.install(launches.Mode.PRELOAD, lambda: path)
    assert launches.install(launches.Mode.PRELOAD, lambda: path)  # a second register()
    jit_monitor.activate(mode="warn")
    assert order == ["preload, monitor active: False", "activate warn"]
    assert engine_module.plain.preloaded == ["a"]
    assert "kernelbake: 1 Triton kernel specialisations" in capsys.readouterr().err


def test_build_records_what_is_first_launched_after_vllm_activates_its_monitor(
    tmp_path: Path,
    triton: types.SimpleNamespace,
    jit_monitor: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "vllm" / launches.RECORD
    warned: list[str] = []
    plain_activate = jit_monitor.activate

    def vllm_activate(**kw: Any) -> None:
        # As vLLM 0.26's activate: its own hook, which logs "JIT compilation during inference".
        plain_activate(**kw)
        triton.knobs.runtime.jit_post_compile_hook = lambda **k: warned.append(k["key"])

    monkeypatch.setattr(jit_monitor, "activate", vllm_activate)
    assert launches.install(launches.Mode.RECORD, lambda: path)
    kernel = JITFunction(_kernel)
    assert triton.knobs.runtime.jit_post_compile_hook is None  # nothing before vLLM's warm-up ends
    jit_monitor.activate(mode="warn")
    triton.knobs.runtime.jit_post_compile_hook(**_hook_call(kernel, "k9"))
    assert json.loads(path.read_text())["key"] == "k9"
    assert warned == ["k9"]


def _vllm_that_moved_its_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.utils", types.ModuleType("vllm.utils"))
    monkeypatch.setitem(sys.modules, "vllm.utils.jit_monitor", None)  # import fails
    _as_vllm_0_26(monkeypatch)


def test_a_vllm_that_moved_its_monitor_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    """A release that moves the monitor must not switch the preload off unseen: the build's
    record raises (vLLM does not catch a general plugin's error, so compile-only fails), and
    the image's hook check names the missing function."""
    from kernelbake.runtime.engines.vllm import _v0_26, _v0_32, compat_layer

    _vllm_that_moved_its_monitor(monkeypatch)
    with pytest.raises(launches.MonitorMissing, match=r"vllm 0\.26\.0: vLLM's JIT monitor is not where"):
        launches.install(launches.Mode.RECORD)
    for adapter in (_v0_26, _v0_32):
        monitored = [h for h in adapter.HOOKS if h.path.startswith("vllm.utils.jit_monitor:")]
        assert [h.path for h in monitored] == [
            "vllm.utils.jit_monitor:activate",
            "vllm.utils.jit_monitor:is_active",
        ]
        assert all("missing" in p for p in compat_layer.hook_problems(tuple(monitored)))


def test_a_serving_start_says_when_the_monitor_moved_and_serves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kernelbake.runtime.engines.vllm import plugin

    _vllm_that_moved_its_monitor(monkeypatch)
    record = tmp_path / launches.RECORD
    record.parent.mkdir(parents=True)
    record.write_text(_line("vllm.kb_test_kernels", "plain", "a") + "\n")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    plugin._preload_first_launches()
    assert "kernelbake: WARNING: vllm 0.26.0: vLLM's JIT monitor is not where" in capsys.readouterr().err


def test_the_build_record_lives_under_the_cache_root_the_adapter_reports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import dataclasses

    from kernelbake.runtime.engines.vllm import _v0_26, compat_layer

    moved = dataclasses.replace(_v0_26.LOOKUPS, cache_root=lambda: str(tmp_path))
    monkeypatch.setattr(compat_layer, "lookups", lambda: moved)
    assert launches.record_path() == tmp_path / launches.RECORD


def test_a_preload_that_breaks_leaves_the_engine_starting(
    tmp_path: Path,
    jit_monitor: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No Triton driver at all here: preload raises before any kernel.
    monkeypatch.setitem(sys.modules, "triton.runtime.driver", None)
    path = tmp_path / "record.jsonl"
    path.write_text(_line("vllm.kb_test_kernels", "plain", "a") + "\n")
    assert launches.install(launches.Mode.PRELOAD, lambda: path)
    jit_monitor.activate(mode="warn")
    assert jit_monitor.calls == ["activate warn"]
    assert "kernelbake: no Triton kernel preloaded: " in capsys.readouterr().err


def test_the_plugin_at_serve_preloads_the_record_under_vllm_cache_root(
    tmp_path: Path,
    triton: types.SimpleNamespace,
    engine_module: types.ModuleType,
    jit_monitor: types.ModuleType,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The path the plugin checks is the one preloaded: both from VLLM_CACHE_ROOT.
    from kernelbake.runtime.engines.vllm import plugin, predict
    from kernelbake.runtime.env import GATE_ENV

    monkeypatch.setattr(predict, "serve_hook", lambda manifest: None)
    monkeypatch.delenv(GATE_ENV, raising=False)
    monkeypatch.delenv(plugin.COMPILE_ONLY_ENV, raising=False)
    monkeypatch.setenv(plugin.BAKED_MANIFEST_ENV, str(tmp_path / "manifest.json"))
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "none"))
    plugin.register()
    assert getattr(jit_monitor.activate, "kernelbake_mode", None) is None  # no record: untouched

    record = tmp_path / "vllm" / launches.RECORD
    record.parent.mkdir(parents=True)
    record.write_text(_line("vllm.kb_test_kernels", "plain", "a") + "\n")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    plugin.register()
    jit_monitor.activate(mode="warn")
    assert engine_module.plain.preloaded == ["a"]
