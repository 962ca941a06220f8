"""vLLM's own cache identity, computed by vLLM's own code (import only where vLLM is installed).

What decides whether a start finds a baked cache is what vLLM and its libraries hash; this
module asks each of them and records both the hashes and the factors they were computed from:

- torch.compile (``vllm`` kind): ``VllmConfig.compute_hash()`` and each hashed sub-config's
  own ``compute_hash`` factors; ``envs.compile_factors()`` (vLLM's list minus its
  ``ignored_factors``) and its hash; the compiler's ``compute_hash`` (Inductor: device name,
  CUDA, Triton and torch keys, Inductor/functorch config); ``aot_compile_hash_factors``; the
  files Dynamo traced, by path and content digest (recorded at build time);
- Inductor outside the model (``inductor``): the compiler factors;
- Triton (``triton``): ``triton_key()``, the backend hash (ptxas version and arch) and
  Triton's cache-invalidating variables, what ``get_cache_key`` adds to a kernel's source;
- FlashInfer (``flashinfer``): its version, its JIT workspace (path includes the arch) and the
  absolute paths its build.ninja files name;
- DeepGEMM and FlashInfer's TensorRT-LLM DeepGEMM (``deepgemm``, ``trtllm-deepgemm``): what
  their kernels' names are made from (``gemm_jit``).

Every vLLM object is found through the installed release's adapter (``compat_layer.lookups()``:
its ``VllmLookups``), so a release that moves one changes its adapter, not this
module. torch's and Triton's own internals (Inductor's config, ``triton_key`` …) are read here.

The factors are recorded by watching vLLM's own hash functions receive them
(``_recording``): nothing here decides what vLLM hashes. Values under secret-carrying names
are digested before they are stored (``kernelbake.runtime.redact``).

Everything is computed at one point, right after vLLM built its ``VllmConfig`` and before
the engine core starts (``hook``), at build time in the compile-only run and at serve time
in the API-server process, so both sides are comparable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.runtime import knobs, redact
from kernelbake.runtime.engines.vllm import compat_layer, gemm_jit

SCHEMA = 1
# Where the identity lives in the manifest's compile report.
REPORT_KEY = "engine_identity"
# The inductor options vLLM ties to its logging level (torch < 2.12): pinned at their INFO
# value so that VLLM_LOGGING_LEVEL=DEBUG keeps the baked hash.
_LOG_LEVEL = "VLLM_LOGGING_LEVEL"
# build.ninja tokens; a compiler flag's prefix (``-I/usr/...``) is not part of its path, and
# ``$cuda_home/bin/nvcc`` is relative to a variable, not absolute.
_NINJA_SPLIT = re.compile(r"[\s\"'=,;:]+")
_FLAG_PREFIX = re.compile(r"^-{1,2}[A-Za-z][A-Za-z_-]*(?=/)")


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, sort_keys=True, default=repr))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- watching vLLM's hash functions ------------------------------------------------------


@contextlib.contextmanager
def _recording() -> Iterator[list[tuple[Any, str]]]:
    """Every (input, output) that vLLM's config hash helpers see while this is open.

    vLLM's configs hash either a named dict (``vllm.config.utils.hash_factors``, imported at
    call time) or ``str(list)`` (``safe_hash``, imported at module load in each config
    module), so both are wrapped where the configs look them up."""
    vllm = compat_layer.lookups()
    cu = vllm.config_utils()

    calls: list[tuple[Any, str]] = []
    original_hf = cu.hash_factors

    def hash_factors(items: dict[str, object]) -> str:
        out = str(original_hf(items))
        calls.append((dict(items), out))
        return out

    patched: list[tuple[Any, str, Any]] = [(cu, "hash_factors", original_hf)]
    cu.hash_factors = hash_factors
    for module in vllm.config_modules():
        if getattr(module, "hash_factors", None) is original_hf:
            patched.append((module, "hash_factors", original_hf))
            module.hash_factors = hash_factors
        safe = getattr(module, "safe_hash", None)
        if callable(safe) and not getattr(safe, "_kernelbake", False):

            def wrapped(data: bytes, *a: Any, _orig: Any = safe, **kw: Any) -> Any:
                h = _orig(data, *a, **kw)
                calls.append((bytes(data).decode(errors="replace"), h.hexdigest()))
                return h

            wrapped._kernelbake = True  # type: ignore[attr-defined]
            patched.append((module, "safe_hash", safe))
            module.safe_hash = wrapped
    try:
        yield calls
    finally:
        for module, attr, value in patched:
            setattr(module, attr, value)


def _factors_of(config: Any) -> tuple[str, Any]:
    """(hash, factors) of one config, as its own ``compute_hash`` saw them."""
    with _recording() as calls:
        h = str(config.compute_hash())
    if not calls:
        return h, None
    inputs, _out = calls[-1]
    if isinstance(inputs, dict):
        # Nested configs hashed inside (e.g. pass_config): named by where their hash went.
        nested = {out: i for i, out in calls[:-1]}
        doc = {}
        for k, v in inputs.items():
            if isinstance(v, str) and v in nested and isinstance(nested[v], dict):
                doc[k] = {"hash": v, "factors": redact.tree(_jsonable(nested[v]))}
            else:
                doc[k] = redact.tree(_jsonable(v), k)
        return h, doc
    return h, str(inputs)


def _fields(config: Any) -> dict[str, Any]:
    """Every field of a config, normalised as vLLM normalises hash factors: names the field
    that changed when a config hashes an unnamed list."""
    normalize_value = compat_layer.lookups().normalize_value
    out = {}
    for f in dataclasses.fields(config):
        try:
            out[f.name] = redact.tree(_jsonable(normalize_value(getattr(config, f.name))), f.name)
        except (TypeError, ValueError):
            continue
    return out


def config_factors(vllm_config: Any) -> dict[str, Any]:
    """``VllmConfig.compute_hash()`` and, for each sub-config whose hash it includes, that
    sub-config's hash and factors; where the release names its factors itself (0.34's
    ``compile_factors``), its own answer."""
    own = compat_layer.lookups().own_config_factors
    if own is not None:
        return own(vllm_config)
    error = ""
    try:
        with _recording() as calls:
            top: str | None = str(vllm_config.compute_hash())
        top_input: str | None = str(calls[-1][0]) if calls else ""
    except Exception as exc:
        # vLLM hashes its config only when it compiles. With compilation off
        # (--enforce-eager) its own hash may fail (0.26 on the H200: KernelConfig raises
        # KeyError 'vllm_c'), and what the start does is then decided by the compile state,
        # not by this hash: the sub-configs are still hashed, each alone.
        top, top_input, error = None, None, f"{type(exc).__name__}: {exc}"
    configs: dict[str, Any] = {}
    for f in dataclasses.fields(vllm_config):
        sub = getattr(vllm_config, f.name, None)
        if sub is None or not callable(getattr(sub, "compute_hash", None)):
            continue
        try:
            h, factors = _factors_of(sub)
        except Exception as exc:  # a config vLLM itself could not hash would fail vLLM too
            configs[f.name] = {"hash": None, "error": f"{type(exc).__name__}: {exc}"}
            continue
        if top_input is not None and h not in top_input:
            continue
        entry: dict[str, Any] = {"hash": h, "factors": factors}
        if not isinstance(factors, dict):
            entry["fields"] = _fields(sub)
        configs[f.name] = entry
    # What the top-level hash adds besides the sub-configs (vLLM's version, additional_config).
    rest = top_input
    for entry in configs.values():
        if entry.get("hash") and rest is not None:
            rest = rest.replace(entry["hash"], "…")
    return {"hash": top, "configs": configs, "other": rest, **({"error": error} if error else {})}


def env_factors() -> dict[str, Any]:
    vllm = compat_layer.lookups()
    factors = vllm.env_compile_factors()
    return {"hash": vllm.hash_factors(factors), "factors": redact.tree(_jsonable(factors))}


# -- the compiler, Triton and FlashInfer (device facts) -----------------------------------


def _compiler(vllm_config: Any) -> dict[str, Any]:
    """The compiler vLLM builds for this config, its hash and the Inductor factors in it."""
    vllm = compat_layer.lookups()
    try:
        compiler = vllm.make_compiler(vllm_config.compilation_config)
    except Exception as exc:
        # vLLM's own function, which its backend calls at every start with compilation on:
        # what it raises here (0.32: VLLM_USE_STANDALONE_COMPILE=0 under its default mega AOT
        # artifact, an assertion) the engine core raises too, and exits.
        return {"refused": f"{type(exc).__name__}: {exc}"}
    try:
        names = ("system", "torch_key", "inductor_config", "functorch_config")
        factors = vllm.inductor_factors()
        return {
            "name": type(compiler).__name__,
            "hash": vllm.compiler_hash(compiler, vllm_config),
            "factors": {names[i] if i < len(names) else str(i): _jsonable(v) for i, v in enumerate(factors)},
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _compiler_and_libraries(vllm_config: Any) -> dict[str, Any]:
    """Needs the device: runs where CUDA may be initialised (see ``_device_side``)."""
    out: dict[str, Any] = {"compiler": _compiler(vllm_config)}
    try:
        # Apart from the compiler's: it hashes the whole config, which may fail where the
        # compiler's own hash does not (compilation off, see ``config_factors``).
        factors_aot = compat_layer.lookups().aot_compile_hash_factors(vllm_config)
        out["aot"] = {"factors_digest": _sha256(str(factors_aot).encode())}
    except Exception as exc:
        out["aot"] = {"error": f"{type(exc).__name__}: {exc}"}
    out["triton"] = _triton_facts()
    out["flashinfer"] = _flashinfer_facts()
    try:
        out.update(gemm_jit.facts(os.environ, _device()))
    except Exception as exc:
        # An unreadable package file: the kinds' prediction then names this, not a hit.
        out.update({kind: {"error": f"{type(exc).__name__}: {exc}"} for kind in gemm_jit.KINDS})
    return out


def _device() -> dict[str, Any]:
    """The device's name and SM count (DeepGEMM's generated source holds the count)."""
    import torch

    if not torch.cuda.is_available():
        return {}
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "sms": props.multi_processor_count}


def _triton_facts() -> dict[str, Any]:
    try:
        import triton
        from triton.runtime.cache import triton_key
    except ImportError:
        return {"installed": False}
    facts: dict[str, Any] = {"version": triton.__version__, "triton_key": _sha256(str(triton_key()).encode())}
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars

        facts["env"] = redact.tree(_jsonable(dict(get_cache_invalidating_env_vars())))
    except Exception as exc:
        facts["env"] = {"error": type(exc).__name__}
    try:
        from triton.compiler.compiler import make_backend
        from triton.runtime.driver import driver

        facts["backend"] = str(make_backend(driver.active.get_current_target()).hash())
    except Exception as exc:
        # No GPU driver (CPU hosts): Triton compiles nothing here.
        facts["backend"] = f"unavailable: {type(exc).__name__}"
    return facts


def _flashinfer_facts() -> dict[str, Any]:
    try:
        import flashinfer
        import flashinfer.jit.env as jit_env
    except Exception:
        return {"installed": False}
    facts: dict[str, Any] = {"version": str(getattr(flashinfer, "__version__", "?"))}
    for name in ("FLASHINFER_WORKSPACE_DIR", "FLASHINFER_JIT_DIR", "FLASHINFER_CUBIN_DIR"):
        if hasattr(jit_env, name):
            facts[name.lower()] = str(getattr(jit_env, name))
    return facts


def _device_side(vllm_config: Any) -> dict[str, Any]:
    """``_compiler_and_libraries`` without initialising CUDA in this process.

    vLLM's API server never initialises CUDA (its engine core is forked or spawned after), so
    there the device facts come from a forked child; where CUDA is already initialised (the
    compile-only run) a fork could not use it, so they are computed in place."""
    import torch

    if torch.cuda.is_initialized() or not hasattr(os, "fork"):
        return _compiler_and_libraries(vllm_config)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read)
        try:
            data = json.dumps(_compiler_and_libraries(vllm_config), default=repr).encode()
        except BaseException as exc:
            data = json.dumps({"compiler": {"error": f"{type(exc).__name__}: {exc}"}}).encode()
        with os.fdopen(write, "wb") as fh:
            fh.write(data)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        data = fh.read()
    os.waitpid(pid, 0)
    try:
        doc: dict[str, Any] = jsondoc.loads(data)
    except ValueError:
        doc = {"compiler": {"error": "the device-side child returned nothing"}}
    return doc


# -- the whole identity --------------------------------------------------------------------


def graphs_store() -> str:
    """Where vLLM's compiled graphs are kept: its AOT artifact under ``VLLM_CACHE_ROOT``
    (``vllm``), or, with AOT compile off (the CPU build, docs/vllm.md), Inductor's own FX-graph
    cache under ``TORCHINDUCTOR_CACHE_DIR`` (``inductor``)."""
    return "vllm" if compat_layer.lookups().aot_compile_enabled() else "inductor"


def _switch_values(prefix: str, config: Any) -> dict[str, bool]:
    """A torch config module's boolean cache switches, by their dotted name. Which options
    are switches is read off the module (its options whose name says cache), not listed."""
    try:
        values = config.get_config_copy()
    except Exception:
        return {}
    return {f"{prefix}.{k}": v for k, v in sorted(values.items()) if "cache" in k and isinstance(v, bool)}


def compile_state(vllm_config: Any) -> dict[str, Any]:
    """How this start compiles, read after vLLM built its config and with this process's
    environment applied: the compilation mode and backend vLLM chose (its platform may
    change both: the CPU build's ``VLLM_CPU_CI_ENV`` picks the eager backend), the cache
    switches of Inductor and AOTAutograd, vLLM's own answer to "is my compile cache on",
    where each cache is read from, and which of them loading vLLM's AOT artifact reads."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    vllm = compat_layer.lookups()
    cc = vllm_config.compilation_config
    switches = {
        **_switch_values("torch._inductor.config", inductor_config),
        **_switch_values("torch._functorch.config", functorch_config),
    }
    switches["vllm is_compile_cache_enabled"] = vllm.compile_cache_enabled(cc)
    # Computed as Inductor computes it, without its side effects (it creates the directory).
    inductor_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    dirs = {
        "inductor": str(Path(inductor_dir).absolute()),
        "vllm": str(Path(vllm.cache_root()).absolute()),
    }
    if getattr(cc, "cache_dir", ""):
        dirs["vllm compilation_config.cache_dir"] = str(Path(cc.cache_dir).absolute())
    return {
        "mode": str(getattr(cc.mode, "name", cc.mode)),
        "backend": str(cc.backend),
        "switches": switches,
        "dirs": dirs,
        # Whether vLLM loads its AOT artifact this start, and what that load reads: the
        # adapter's answer for this release, from vLLM's own values of its variables.
        "artifact": vllm.aot_artifact(),
        # Debug and force-recompile knobs of torch and Triton that no key includes.
        "unkeyed": knobs.unkeyed_knobs(os.environ),
    }


def model_modules(vllm_config: Any) -> list[str]:
    """The source files vLLM keys its model-info cache (``VLLM_CACHE_ROOT/modelinfos``) on:
    the module of each architecture's registered class, as vLLM's registry names it."""
    import importlib.util

    out: set[str] = set()
    for arch in getattr(vllm_config.model_config, "architectures", None) or []:
        module = compat_layer.lookups().model_module(arch)
        try:
            spec = importlib.util.find_spec(module) if module else None
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            out.add(str(spec.origin))
    return sorted(out)


def identity(vllm_config: Any, cache_env: Mapping[str, str]) -> dict[str, Any]:
    """Everything vLLM and its libraries key their caches on, for this config and process."""
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "engine": "vllm",
        "version": compat_layer.lookups().version(),
        "config": config_factors(vllm_config),
        "env": env_factors(),
        "cache_env": {k: redact.shown(k, v) for k, v in sorted(cache_env.items())},
        "graphs": graphs_store(),
        "compile": compile_state(vllm_config),
        "model_modules": model_modules(vllm_config),
    }
    doc.update(_device_side(vllm_config))
    return doc


def code_digests(paths: Sequence[str]) -> dict[str, str]:
    """Content digests of the files Dynamo traced (vLLM re-reads them to hash the code)."""
    out = {}
    for p in paths:
        try:
            out[p] = _sha256(Path(p).read_bytes())
        except OSError:
            out[p] = "missing"
    return out


def ninja_paths(flashinfer_dir: Path) -> list[str]:
    """Absolute directories FlashInfer's build.ninja files name: a JIT module rebuilds when
    they differ, which is why that cache is not relocatable."""
    roots: set[str] = set()
    for ninja in flashinfer_dir.rglob("build.ninja") if flashinfer_dir.is_dir() else ():
        for token in _NINJA_SPLIT.split(ninja.read_text(errors="replace")):
            path = _FLAG_PREFIX.sub("", token)
            if path.startswith("/") and len(Path(path).parts) > 2:
                parts = Path(path).parts
                roots.add(str(Path(*parts[: min(len(parts), 5)])))
    return sorted(roots)


def compile_dirs(vllm_cache: Path) -> dict[str, list[str]]:
    """The torch.compile cache directories vLLM created (named by its hashes)."""
    base = vllm_cache / "torch_compile_cache"
    out: dict[str, list[str]] = {"torch_compile_cache": [], "torch_aot_compile": []}
    if base.is_dir():
        out["torch_compile_cache"] = sorted(
            p.name for p in base.iterdir() if p.is_dir() and p.name != "torch_aot_compile"
        )
        aot = base / "torch_aot_compile"
        if aot.is_dir():
            out["torch_aot_compile"] = sorted(p.name for p in aot.iterdir() if p.is_dir())
    return out


# -- pins -------------------------------------------------------------------------------


def log_level_pins() -> dict[str, Any]:
    """The Inductor options whose default vLLM derives from ``VLLM_LOGGING_LEVEL``, with their
    value at the default level: asked of vLLM by building its ``CompilationConfig`` at both
    levels. Empty where vLLM no longer ties them (torch >= 2.12)."""
    compilation_config = compat_layer.lookups().compilation_config_class()

    def options(level: str | None) -> dict[str, Any]:
        saved = os.environ.get(_LOG_LEVEL)
        try:
            if level is None:
                os.environ.pop(_LOG_LEVEL, None)
            else:
                os.environ[_LOG_LEVEL] = level
            return dict(compilation_config().inductor_compile_config)
        finally:
            if saved is None:
                os.environ.pop(_LOG_LEVEL, None)
            else:
                os.environ[_LOG_LEVEL] = saved

    default, debug = options(None), options("DEBUG")
    return {
        k: default[k]
        for k in sorted(set(default) | set(debug))
        if default.get(k) != debug.get(k) and isinstance(default.get(k), (bool, int, str))
    }


# -- the hook: right after vLLM built its config ---------------------------------------


def install_hook(on_config: Callable[[Any, Any], None]) -> None:
    """Call ``on_config(engine_args, vllm_config)`` each time vLLM builds its config from
    engine arguments (``EngineArgs.create_engine_config``: the API server calls it once,
    before it starts the engine core). The last install wins."""
    engine_args = compat_layer.lookups().engine_args_class()

    original = getattr(
        engine_args.create_engine_config, "_kernelbake_original", engine_args.create_engine_config
    )

    @functools.wraps(original)
    def create_engine_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = original(self, *args, **kwargs)
        on_config(self, config)
        return config

    create_engine_config._kernelbake_original = original  # type: ignore[attr-defined]
    engine_args.create_engine_config = create_engine_config


def record_traced_files(report: MutableMapping[str, Any]) -> None:
    """Build time: the files Dynamo traced, as vLLM's backend hashes them (it clears the set
    once hashed, so they are read on the way in)."""
    backend = compat_layer.lookups().backend_class()

    original = backend.__call__
    if getattr(original, "_kernelbake", False):
        return

    @functools.wraps(original)
    def call(self: Any, graph: Any, example_inputs: Any) -> Any:
        files = sorted(f for f in self.compilation_config.traced_files if f != "<string>")
        report.setdefault("traced_files", [])
        report["traced_files"] = sorted(set(report["traced_files"]) | set(files))
        return original(self, graph, example_inputs)

    call._kernelbake = True  # type: ignore[attr-defined]
    backend.__call__ = call
