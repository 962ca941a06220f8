"""Compile-only for vLLM 0.34 (the CUDA image; PyPI's CPU build stops at 0.32).

0.26's compile-only (``_v0_26``), with what 0.34 moved, each read from the 0.34.0 wheel's source
(bench/vllm_hooks_from_wheel.py, bench/results/vllm-0.34.0-hooks.json):

- the serve parser is in ``vllm.entrypoints.common.cli_args``;
- the KV-cache admission check is in ``vllm.v1.core.kv_cache_planning`` and takes a ``hint``;
- configs no longer have ``compute_hash``: each says its factors (``compile_factors()``, a
  named dict) and vLLM hashes them with ``hash_factors`` (``compilation.caching.
  compute_env_and_config_hashes``), so identity reads them from the config instead of watching
  a hash function;
- the compiler says its factors too (``compile_factors(vllm_config)``) and ``make_compiler`` and
  ``get_inductor_factors`` take ``use_aot_compile``: the model's compiler is built with it on
  (vLLM's ``support_torch_compile`` default), whatever ``VLLM_USE_AOT_COMPILE`` says.

Not run: 0.34 pins torch 2.14.0 and flashinfer-python 0.7.3, which this project's package
registry does not have (docs/engines.md).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from kernelbake.runtime.engines.vllm import _v0_26, _v0_32
from kernelbake.runtime.engines.vllm.compat_layer import Hook

KV_ADMISSION_MODULE = "vllm.v1.core.kv_cache_planning"
# The model's compiler: vLLM's decorator allows AOT compile unless a model opts out.
_MODEL_USE_AOT_COMPILE = True

_MOVED = {
    "vllm.entrypoints.launchers.cli_args:make_arg_parser",
    "vllm.v1.core.kv_cache_utils:_check_enough_kv_cache_memory",
    "vllm.compilation.backends:make_compiler",
    "vllm.compilation.compiler_interface:get_inductor_factors",
}

HOOKS: tuple[Hook, ...] = (
    *(h for h in _v0_32.HOOKS if h.path not in _MOVED),
    Hook("vllm.entrypoints.common.cli_args:make_arg_parser", ("parser",)),
    Hook(
        f"{KV_ADMISSION_MODULE}:_check_enough_kv_cache_memory",
        ("available_memory", "get_needed_memory", "max_model_len", "estimate_max_model_len", "hint"),
    ),
    Hook("vllm.compilation.backends:make_compiler", ("compilation_config", "use_aot_compile")),
    Hook("vllm.compilation.compiler_interface:get_inductor_factors", ("use_aot_compile",)),
    Hook("vllm.compilation.compiler_interface:CompilerInterface.compile_factors", ("self", "vllm_config")),
    Hook("vllm.config:VllmConfig.compile_factors", ("self", "include_version")),
    # What cache_key_factors.json holds, computed now (predict.engine_factors_now).
    Hook("vllm.compilation.caching:compute_env_and_config_hashes", ("vllm_config",)),
    Hook("vllm.compilation.caching:get_code_factors", ("contents",)),
    Hook("vllm.compilation.caching:read_code_files", ("files",)),
)


def _make_compiler(compilation_config: Any) -> Any:
    from vllm.compilation.backends import make_compiler

    return make_compiler(compilation_config, use_aot_compile=_MODEL_USE_AOT_COMPILE)


def _inductor_factors() -> Sequence[Any]:
    from vllm.compilation.compiler_interface import get_inductor_factors

    return list(get_inductor_factors(_MODEL_USE_AOT_COMPILE))


def _compiler_hash(compiler: Any, vllm_config: Any) -> str:
    # As VllmBackend.__call__ hashes them in 0.34.
    return _v0_26.LOOKUPS.hash_factors(compiler.compile_factors(vllm_config))


def _config_hash(vllm_config: Any) -> str:
    return _v0_26.LOOKUPS.hash_factors(vllm_config.compile_factors())


def _own_config_factors(vllm_config: Any) -> dict[str, Any]:
    """The config's factors as vLLM hashes them, in identity.config_factors' shape: each named
    part (``model``, ``compilation`` …) with its own hash, the rest (version) as ``other``."""
    from kernelbake.runtime import redact

    def jsonable(value: Any) -> Any:
        return json.loads(json.dumps(value, sort_keys=True, default=repr))

    hash_factors = _v0_26.LOOKUPS.hash_factors
    factors = vllm_config.compile_factors()
    configs = {
        name: {"hash": hash_factors(value), "factors": redact.tree(jsonable(value))}
        for name, value in factors.items()
        if isinstance(value, dict)
    }
    other = {name: value for name, value in factors.items() if not isinstance(value, dict)}
    return {"hash": hash_factors(factors), "configs": configs, "other": jsonable(other)}


def _cache_key_factors(vllm_config: Any, code_paths: Sequence[str]) -> dict[str, Any]:
    """What VllmBackend.__call__ writes to cache_key_factors.json, from the same functions."""
    from pathlib import Path

    from vllm.compilation.caching import compute_env_and_config_hashes, get_code_factors, read_code_files

    hash_factors = _v0_26.LOOKUPS.hash_factors
    _env_hash, config_hash, env_factors, config_factors = compute_env_and_config_hashes(vllm_config)
    compiler_factors = _make_compiler(vllm_config.compilation_config).compile_factors(vllm_config)
    code = get_code_factors(read_code_files(Path(p) for p in code_paths))
    doc = {
        "env": env_factors,
        "config": config_factors,
        "code": {"files": code},
        "compiler": compiler_factors,
        "config_hash": config_hash,
        "code_hash": hash_factors({"files": code}),
        "compiler_hash": hash_factors(compiler_factors),
    }
    # As json.dump wrote the baked side: tuples are lists there.
    return dict(json.loads(json.dumps(doc, sort_keys=True, default=repr)))


LOOKUPS = dataclasses.replace(
    _v0_26.LOOKUPS,
    make_compiler=_make_compiler,
    inductor_factors=_inductor_factors,
    compiler_hash=_compiler_hash,
    config_hash=_config_hash,
    own_config_factors=_own_config_factors,
    cache_key_factors=_cache_key_factors,
)

rank_report = _v0_26.rank_report
load_format = _v0_32.load_format


def parse_serve_argv(argv: Sequence[str]) -> Any:
    """As 0.26's, with the serve parser where 0.34 moved it."""
    from vllm.entrypoints.common.cli_args import make_arg_parser

    return _v0_26.parse_with(make_arg_parser, argv)


def install(report: MutableMapping[str, Any]) -> None:
    _v0_26.install(report, kv_admission=KV_ADMISSION_MODULE)


if TYPE_CHECKING:
    # This module is a release adapter: mypy checks it has all ``ReleaseAdapter`` asks for.
    from kernelbake.runtime.engines.vllm import _v0_34 as _this
    from kernelbake.runtime.engines.vllm.compat_layer import ReleaseAdapter

    _conforms: ReleaseAdapter = _this
