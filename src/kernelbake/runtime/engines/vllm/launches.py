"""Triton kernels that requests first launch after vLLM's warm-up: recorded at build, loaded
into the serving process before ``/health``.

vLLM 0.26 warms up with dummy batches and one sampler pass, then activates its JIT monitor
(``vllm.utils.jit_monitor.activate``). From then on Triton's ``jit_post_compile_hook`` fires
for every kernel specialisation a process launches for the first time, and vLLM logs it
("Triton kernel JIT compilation during inference"). The build's request warm-up
(``warmup``) compiles those specialisations into the bundle's Triton cache, so a baked start
writes no file after ``/health``; but the serving process still has to find each one on its
first request (Triton's file cache, then a module load), and vLLM logs that as a compile.
Measured on the H200 (bench/results/vllm-0.26.0-h200-moe/): ``fused_moe_kernel``,
``_topk_topp_kernel`` and ``_topk_log_softmax_kernel`` after ``/health``, no file written.

Triton can put a specialisation into a kernel's in-process cache without launching it
(``JITFunction.preload``, from the specialization data its compile hooks are given). So:

- at build (``Mode.RECORD``), once vLLM has activated its monitor, every first launch is
  appended to ``RECORD`` in the ``vllm`` cache kind, which the manifest lists and the
  signature covers;
- at serve (``Mode.PRELOAD``), just before vLLM activates its monitor, each is preloaded
  (from the baked Triton cache; compiled there, before ``/health``, if it is missing).

A first request then finds its kernel in memory: nothing is compiled or loaded after
``/health``, and the monitor has nothing to say. Anything that cannot be preloaded is named
on stderr and left to the first request, as without this module.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.runtime.engines.vllm import compat_layer

# Relative to VLLM_CACHE_ROOT, which kernelbake points into the bundle's ``vllm`` kind.
RECORD = Path("kernelbake") / "triton-first-launches.jsonl"
# Only kernels of the engine are imported by name from the record (it is signed, but a name
# should not reach beyond the engine); others must already be imported by then.
_IMPORTABLE = ("vllm",)


class Mode(enum.Enum):
    """Record first launches at build, or preload them at serve (the module's docstring says when)."""

    RECORD = "record"
    PRELOAD = "preload"


@dataclasses.dataclass(frozen=True)
class Preloaded:
    """What a preload at serve did, for its stderr line."""

    loaded: int
    present: int
    failed: tuple[str, ...]
    seconds: float

    def line(self) -> str:
        text = (
            f"kernelbake: {self.loaded} Triton kernel specialisations that requests first launch "
            f"loaded before vLLM's JIT monitor starts ({self.present} already loaded, "
            f"{len(self.failed)} failed) in {self.seconds:.2f} s"
        )
        return text + "".join(
            f"\nkernelbake: not preloaded (its first request loads it): {f}" for f in self.failed[:5]
        )


class MonitorMissing(LookupError):
    """vLLM's JIT monitor is not where the installed release's adapter says it is."""


def record_path() -> Path:
    """Where the build records: under the cache root vLLM itself resolved (through the
    release adapter). A serving process finds the record on the environment,
    ``record_at_serve``, before vLLM loads."""
    return Path(compat_layer.lookups().cache_root()) / RECORD


def monitor() -> Any:
    """vLLM's JIT monitor, where the installed release's adapter says it is (its ``HOOKS``
    list ``activate`` and ``is_active``, checked in the image). A release that moved it
    raises ``MonitorMissing`` naming that release, instead of switching the preload off
    unseen: it needs an adapter that says where the monitor went."""
    try:
        found = compat_layer.lookups().jit_monitor()
        found.activate, found.is_active  # noqa: B018 (the two this module uses)
    except (ImportError, AttributeError) as exc:
        dist, version = compat_layer.installed_vllm()
        raise MonitorMissing(
            f"{dist} {version}: vLLM's JIT monitor is not where kernelbake's adapter for it looks "
            f"({type(exc).__name__}: {exc}); Triton first launches are neither recorded nor preloaded"
        ) from exc
    return found


def install(mode: Mode, path: Callable[[], Path] = record_path) -> bool:
    """Wraps vLLM's ``jit_monitor.activate`` (called once per worker, at the end of its
    warm-up) to record or preload around it. Raises ``MonitorMissing`` where the monitor is
    not where the adapter says."""
    jit_monitor = monitor()
    original = jit_monitor.activate
    if getattr(original, "kernelbake_mode", None) is not None:
        return True

    def activate(*args: Any, **kwargs: Any) -> Any:
        # Neither side may stop the engine: without them a first request loads its kernel,
        # as in plain vLLM. What went wrong is said, not hidden.
        if mode is Mode.PRELOAD and not jit_monitor.is_active():
            try:
                print(preload(path()).line(), file=sys.stderr, flush=True)
            except Exception as exc:
                print(f"kernelbake: no Triton kernel preloaded: {type(exc).__name__}: {exc}", file=sys.stderr)
        result = original(*args, **kwargs)
        if mode is Mode.RECORD:
            try:
                record(path())
            except Exception as exc:
                print(
                    f"kernelbake: Triton first launches not recorded: {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                )
        return result

    activate.kernelbake_mode = mode  # type: ignore[attr-defined]
    jit_monitor.activate = activate
    return True


def record(path: Path) -> None:
    """From now on, appends each Triton first launch in this process to ``path``, then calls
    the hook that was there (vLLM's monitor)."""
    from triton import knobs

    existing = knobs.runtime.jit_post_compile_hook
    seen: set[tuple[str, str, str]] = set()

    def hook(**kwargs: Any) -> Any:
        entry = _entry(kwargs)
        if entry is not None and (ident := (entry["module"], entry["qualname"], entry["key"])) not in seen:
            seen.add(ident)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                # One short line per write, appended: ranks of one build can share the file.
                with path.open("a") as fh:
                    fh.write(json.dumps(entry, sort_keys=True) + "\n")
            except OSError as exc:
                print(f"kernelbake: cannot record a Triton first launch in {path}: {exc}", file=sys.stderr)
        return existing(**kwargs) if existing is not None else None

    knobs.runtime.jit_post_compile_hook = hook


def _entry(kwargs: dict[str, Any]) -> dict[str, str] | None:
    """What ``preload`` needs of one hook call: the kernel's module and name, Triton's cache
    key and its specialization data. None for a call that lacks them (a Triton release
    that renamed a field: the first request then compiles as before)."""
    info = kwargs.get("fn")
    compile_info = kwargs.get("compile")
    fn = getattr(getattr(info, "jit_function", None), "fn", None)
    if not isinstance(compile_info, dict) or fn is None:
        return None
    data, key = compile_info.get("specialization_data"), compile_info.get("key")
    if not isinstance(data, str) or not isinstance(key, str):
        return None
    return {"module": str(fn.__module__), "qualname": str(fn.__qualname__), "key": key, "data": data}


def preload(path: Path) -> Preloaded:
    """Loads each recorded specialisation into its kernel's in-process cache on the current
    device, unless it is there already."""
    started = time.monotonic()
    if not path.is_file():
        return Preloaded(0, 0, (), 0.0)
    from triton.runtime.driver import driver

    device = driver.active.get_current_device()
    loaded = present = 0
    failed: list[str] = []
    done: set[tuple[str, str, str]] = set()
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        try:
            entry = jsondoc.loads(raw)
            module, qualname, key, data = (str(entry[k]) for k in ("module", "qualname", "key", "data"))
        except (ValueError, KeyError, TypeError):
            failed.append(f"{path}:{number}: not a recorded launch")
            continue
        if (module, qualname, key) in done:
            continue
        done.add((module, qualname, key))
        try:
            kernel = _jit_function(module, qualname)
            if key in kernel.device_caches[device][0]:
                present += 1
                continue
            kernel.preload(data)
            loaded += 1
        except Exception as exc:  # one kernel's failure leaves it to its first request
            failed.append(f"{module}.{qualname}: {type(exc).__name__}: {exc}"[:240])
    return Preloaded(loaded, present, tuple(failed), round(time.monotonic() - started, 3))


def _jit_function(module: str, qualname: str) -> Any:
    from triton.runtime.jit import JITFunction

    if module not in sys.modules and module.split(".")[0] not in _IMPORTABLE:
        raise LookupError(f"module {module} is not loaded and not the engine's")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    # @triton.autotune and @triton.heuristics wrap the JITFunction as ``fn``.
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise TypeError(f"{type(obj).__name__} is not a Triton JIT function")
    return obj


def record_at_serve(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The record a serving process preloads, or None: found on the environment alone, so a
    start without one imports nothing more, and the path checked is the one preloaded.
    kernelbake's serve always sets an absolute VLLM_CACHE_ROOT; where it is unset nothing is
    preloaded and each kernel loads on its first request, as in plain vLLM."""
    root = environ.get("VLLM_CACHE_ROOT")
    if not root:
        return None
    path = Path(root) / RECORD
    return path if path.is_file() else None
