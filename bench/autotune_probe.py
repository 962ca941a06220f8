"""Why Inductor benchmarks a baked kernel again at a warm start: a diagnostic for one baked start.

On the H200 (vLLM 0.32, torch 2.13) the Qwen3-8B's baked start rewrote two baked ``.best_config``
files (bench/results/vllm-0.32.0-h200-2026-12-05/README.md); 0.26's FP8 MoE rewrote four at every
start. Inductor writes one only from ``CachingAutotuner.autotune_to_one_config`` (or its coordinate
descent and combo passes), that is after benchmarking more than one launcher. The reading of
torch 2.13's source that this probe is to confirm or refute (docs/vllm.md, "Launch configs
benchmarked again at start"): a kernel loaded from vLLM's mega AOT artifact is a pickled static autotuner
whose compile results were pruned to the build's winner; ``recheck_autotune_cache`` then sees one
config and reads no cache (state "only 1 config", not "hit"), so ``_dynamic_scale_rblock`` adds
a halved-RBLOCK candidate to a register-heavy reduction and the first launch benchmarks both,
saving through the build's hook.

Loaded by ``autotune_probe_site/sitecustomize.py`` (``PYTHONPATH``) in the processes of one
start, it wraps those three methods when torch imports them and writes one line per call to
stderr (the serve log): ``kernelbake-autotune-probe {json}`` with the kernel, its file, whether
it is static, its compile results and launchers, the autotune-cache state, the configs hash of
its compile results against the one in the baked file, and the file's bytes before and after.
It changes nothing the engine does: each wrapper calls the method it wraps, and a fault of its
own is written as a line, never raised.

    python3 bench/vllm_image_flow.py --context .gpu/ctx/qwen3-8b-dummy-h200/context \\
        --baked-only qwen3-8b-dummy --mix-total 0 --skip-checks \\
        --also-env PYTHONPATH=$PWD/bench/autotune_probe_site:$PYTHONPATH --out $RUN_OUT

(in a ``bench/device.sh start`` session, whose PYTHONPATH is the bundle's site and the tree's
src: the extra baked start is the probed one; its log is ``logs/serve-warm-1.log``).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

TARGET = "torch._inductor.runtime.triton_heuristics"
MARK = "kernelbake-autotune-probe "
# The file a line of its own may quote, at most (a .best_config is about 300 bytes).
_QUOTED = 2000


def emit(event: str, **facts: Any) -> None:
    line = json.dumps({"event": event, "pid": os.getpid(), **facts}, sort_keys=True, default=repr)
    sys.stderr.write(MARK + line + "\n")
    sys.stderr.flush()


def _best_config_file(tuner: Any) -> str | None:
    """Where the tuner's save hook writes: ``AutotuneCache.local_cache`` is (cache, path)."""
    cache = getattr(getattr(tuner, "save_cache_hook", None), "__self__", None)
    local = getattr(cache, "local_cache", None)
    return str(local[1]) if local else None


def _read(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(errors="replace")[:_QUOTED]
    except OSError:
        return None


def _stored_hash(text: str | None) -> str | None:
    try:
        return str(json.loads(text or "")["configs_hash"])
    except (ValueError, KeyError, TypeError):
        return None


def facts(tuner: Any, module: ModuleType) -> dict[str, Any]:
    """What decides whether a kernel benchmarks: its configs, launchers and cache state."""
    results = list(getattr(tuner, "compile_results", None) or [])
    static = getattr(tuner, "is_statically_launchable", None)
    path = _best_config_file(tuner)
    stored = _read(path)
    hash_configs: Callable[[Sequence[Any]], str] | None = getattr(module, "hash_configs", None)
    return {
        "kernel": (getattr(tuner, "inductor_meta", None) or {}).get("kernel_name"),
        "filename": getattr(tuner, "filename", None),
        "heuristic": str(getattr(tuner, "heuristic_type", None)),
        "static": bool(results) and bool(static()) if callable(static) else None,
        "compile_results": len(results),
        "launchers": len(getattr(tuner, "launchers", None) or []),
        "cache_state": (getattr(tuner, "autotune_cache_info", None) or {}).get("autotune_cache_state"),
        "best_config_file": path,
        "hook_configs_hash": getattr(getattr(tuner.save_cache_hook, "__self__", None), "configs_hash", None)
        if getattr(tuner, "save_cache_hook", None)
        else None,
        "stored_configs_hash": _stored_hash(stored),
        "results_configs_hash": hash_configs([r.config for r in results])
        if hash_configs and results
        else None,
    }


def _wrapped(module: ModuleType, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def probe(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            before = facts(self, module)
            text = _read(before["best_config_file"])
        except Exception as exc:  # the probe never stops the start
            emit("probe-error", method=name, error=f"{type(exc).__name__}: {exc}")
            return original(self, *args, **kwargs)
        out = original(self, *args, **kwargs)
        try:
            after = facts(self, module)
            now = _read(after["best_config_file"])
            emit(name, before=before, after=after, file_before=text, file_after=now, rewritten=now != text)
        except Exception as exc:
            emit("probe-error", method=name, error=f"{type(exc).__name__}: {exc}")
        return out

    return probe


METHODS = ("recheck_autotune_cache", "_dynamic_scale_rblock", "autotune_to_one_config")


def patch(module: ModuleType) -> list[str]:
    """Wraps ``METHODS`` of the module's ``CachingAutotuner``; the names it wrapped."""
    cls = getattr(module, "CachingAutotuner", None)
    done = []
    for name in METHODS:
        original = getattr(cls, name, None)
        if callable(original) and not getattr(original, "_kernelbake_probe", False):
            wrapper = _wrapped(module, name, original)
            wrapper._kernelbake_probe = True  # type: ignore[attr-defined]
            setattr(cls, name, wrapper)
            done.append(name)
    emit("patched", module=module.__name__, methods=done)
    return done


def _then_patch(exec_module: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def run_then_patch(module: ModuleType) -> None:
        exec_module(module)
        patch(module)

    return run_then_patch


class _Finder(importlib.abc.MetaPathFinder):
    """Patches ``target`` as soon as it is imported, without importing torch itself first
    (every Python process of the start loads this; most never import Inductor)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def find_spec(
        self, fullname: str, path: Any, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.target:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader.exec_module = _then_patch(spec.loader.exec_module)  # type: ignore[method-assign]
                return spec
        return None


def install(target: str = TARGET) -> None:
    if target in sys.modules:
        patch(sys.modules[target])
        return
    if not any(isinstance(f, _Finder) and f.target == target for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(target))
