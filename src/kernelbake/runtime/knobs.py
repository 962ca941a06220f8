"""Knobs outside the cache keys: options of torch's Inductor, Dynamo and functorch configs and of
Triton's knobs that this process set from the environment and that the caches' keys leave out.

Such a knob changes what a start does without changing any key kernelbake compares: with
``TORCH_COMPILE_DEBUG=1`` (``torch._inductor.config.trace.enabled``) Inductor writes its debug
trace, with ``TRITON_ALWAYS_COMPILE=1`` Triton compiles every kernel although its cache holds
it. The set is asked of the libraries, not listed here:

- which options exist, their values now, and which the key includes: each torch config module's
  own ``get_config_copy()`` and ``save_config_portable()`` (what Inductor and AOTAutograd hash;
  Dynamo's config is in neither key), and Triton's ``knobs`` descriptors with
  ``get_cache_invalidating_env_vars()`` (what Triton hashes);
- which variable sets an option: Triton's descriptor names it (``key``); for torch, the
  variables the option's assignment in its config module's source reads.

What each knob then does (``effect``) is read off its name, as torch groups them (Inductor's
``trace`` options, Dynamo's debug options): it writes files, it recompiles, or neither.

Imports torch and Triton; runs in the image.
"""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import json
import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from kernelbake.runtime import redact

_VAR = re.compile(r"^[A-Z][A-Z0-9_]{2,}$")
# torch's config modules and the prefix their options are named by.
_TORCH_CONFIGS = ("torch._inductor.config", "torch._dynamo.config", "torch._functorch.config")
# Of those, the ones whose portable config a cache key includes (Inductor's FX-graph key and
# vLLM's compiler hash take both); Dynamo's options key nothing on disk.
_KEYED = frozenset({"torch._inductor.config", "torch._functorch.config"})


class Effect(enum.Enum):
    """What a knob outside the key does to a start from baked caches."""

    # Writes files (a debug trace, dumps) each time it compiles or loads.
    WRITES = "writes"
    # Compiles although the cache holds the entry.
    RECOMPILES = "recompiles"
    NONE = "none"


_WRITES = re.compile(r"(^|[._])(trace|debug|dump|log|logs|save|print|profile|provenance)([._]|$)")
_RECOMPILES = re.compile(r"always_compile|force_(re)?compile|recompile_always")


def effect(option: str) -> Effect:
    """``torch._inductor.config.trace.enabled`` → writes; ``triton.knobs.compilation.always_compile``
    → recompiles. The name's words, as torch and Triton group their options."""
    name = option.split(".config.", 1)[-1].removeprefix("triton.knobs.")
    if _RECOMPILES.search(name):
        return Effect.RECOMPILES
    if _WRITES.search(name):
        return Effect.WRITES
    return Effect.NONE


def _env_reads(node: ast.AST) -> list[str]:
    """The variable names an assignment's value reads: string constants shaped like one."""
    return sorted(
        {
            n.value
            for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and _VAR.match(n.value)
        }
    )


@functools.cache
def option_variables(module: ModuleType) -> dict[str, tuple[str, ...]]:
    """Dotted option name → the variables its assignment in ``module``'s source reads (classes
    are option groups: ``trace.enabled``)."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return {}
    out: dict[str, tuple[str, ...]] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                reads = tuple(_env_reads(node.value))
                for name in names:
                    if reads:
                        out[f"{prefix}{name}"] = reads

    walk(tree.body, "")
    return out


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


def _torch_knobs(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    import importlib

    out: dict[str, dict[str, Any]] = {}
    for prefix in _TORCH_CONFIGS:
        try:
            module = importlib.import_module(prefix)
            values = module.get_config_copy()
            keyed = set(module.save_config_portable()) if prefix in _KEYED else set()
        except Exception:  # a torch without this module or method: nothing to say of it
            continue
        for option, variables in option_variables(module).items():
            set_now = {v: redact.shown(v, environ[v]) for v in variables if v in environ}
            if set_now and option in values and option not in keyed:
                out[f"{prefix}.{option}"] = {"value": _jsonable(values[option]), "vars": set_now}
    return out


def _triton_knobs(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    try:
        from triton import knobs
    except ImportError:
        return {}
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        keyed = set(get_cache_invalidating_env_vars())
    except Exception:
        keyed = set()
    out: dict[str, dict[str, Any]] = {}
    for group, instance in sorted(vars(knobs).items()):
        if not isinstance(instance, knobs.base_knobs):
            continue
        for name, descriptor in instance.knob_descriptors.items():
            key = getattr(descriptor, "key", None)
            if key and key in environ and key not in keyed:
                value = _jsonable(getattr(instance, name, None))
                out[f"triton.knobs.{group}.{name}"] = {
                    "value": value,
                    "vars": {key: redact.shown(key, environ[key])},
                }
    return out


def unkeyed_knobs(environ: Mapping[str, str]) -> dict[str, Any]:
    """Every knob of torch and Triton that ``environ`` sets and no cache key includes, with its
    value, the variables that set it, its ``effect`` and, for torch's debug output, where it
    writes (``torch._dynamo.config.debug_dir_root``, asked now)."""
    found = {**_torch_knobs(environ), **_triton_knobs(environ)}
    for option, entry in found.items():
        entry["effect"] = effect(option).value
    doc: dict[str, Any] = {"knobs": found}
    try:
        import torch._dynamo.config as dynamo_config

        doc["debug_dir"] = str(dynamo_config.debug_dir_root)
    except Exception:
        pass
    return doc
