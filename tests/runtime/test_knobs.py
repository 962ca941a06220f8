"""runtime.knobs: the knobs outside every cache key, asked of the config modules themselves."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kernelbake.runtime import knobs
from kernelbake.runtime.knobs import Effect, effect

CONFIG = """
import os
fx_graph_cache = os.environ.get("TORCHINDUCTOR_FX_GRAPH_CACHE", "1") == "1"
compile_threads = int(os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "4"))
max_autotune = os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE") == "1"
class trace:
    enabled = os.environ.get("TORCH_COMPILE_DEBUG", "0") == "1"
    debug_dir = None

def get_config_copy():
    return {"fx_graph_cache": fx_graph_cache, "compile_threads": compile_threads,
            "max_autotune": max_autotune, "trace.enabled": trace.enabled, "trace.debug_dir": None}

def save_config_portable():
    # As Inductor's: trace.* and compile_threads are not in the key.
    return {"fx_graph_cache": fx_graph_cache, "max_autotune": max_autotune}
"""


def _load(tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> ModuleType:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    path = tmp_path / (name.replace(".", "_") + ".py")
    path.write_text(CONFIG)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_the_options_variables_are_read_from_the_config_modules_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _load(tmp_path, "kb_fake_config", monkeypatch, {})
    assert knobs.option_variables(module) == {
        "fx_graph_cache": ("TORCHINDUCTOR_FX_GRAPH_CACHE",),
        "compile_threads": ("TORCHINDUCTOR_COMPILE_THREADS",),
        "max_autotune": ("TORCHINDUCTOR_MAX_AUTOTUNE",),
        "trace.enabled": ("TORCH_COMPILE_DEBUG",),
    }


def test_only_knobs_set_from_the_environment_and_left_out_of_the_key_are_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        "TORCH_COMPILE_DEBUG": "1",
        "TORCHINDUCTOR_MAX_AUTOTUNE": "1",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    _load(tmp_path, "torch._inductor.config", monkeypatch, env)
    for other in ("torch._dynamo.config", "torch._functorch.config"):
        monkeypatch.setitem(sys.modules, other, ModuleType(other))  # no config API: skipped
    doc = knobs.unkeyed_knobs(env)
    # max_autotune is in Inductor's key (a change of it is a miss there already).
    assert doc["knobs"] == {
        "torch._inductor.config.trace.enabled": {
            "value": True,
            "vars": {"TORCH_COMPILE_DEBUG": "1"},
            "effect": "writes",
        },
        "torch._inductor.config.compile_threads": {
            "value": 1,
            "vars": {"TORCHINDUCTOR_COMPILE_THREADS": "1"},
            "effect": "none",
        },
    }


@pytest.mark.parametrize(
    ("option", "kind"),
    [
        ("torch._inductor.config.trace.enabled", Effect.WRITES),
        ("torch._inductor.config.trace.provenance_tracking_level", Effect.WRITES),
        ("torch._dynamo.config.debug_dir_root", Effect.WRITES),
        ("triton.knobs.compilation.dump_ir", Effect.WRITES),
        ("triton.knobs.compilation.always_compile", Effect.RECOMPILES),
        ("torch._dynamo.config.force_compile_during_fx_trace", Effect.RECOMPILES),
        ("torch._inductor.config.compile_threads", Effect.NONE),
        ("triton.knobs.cache.dir", Effect.NONE),
    ],
)
def test_each_knobs_effect_follows_its_name(option: str, kind: Effect) -> None:
    assert effect(option) is kind
