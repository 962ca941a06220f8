"""Build-time recording and serve-time prediction, both at the same point in vLLM's start-up.

- build (compile-only run): pin the Inductor options vLLM ties to its log level, then record
  vLLM's identity right after it built its config (``record_at_build``), and once the engine
  ran, the files Dynamo traced, the cache directories vLLM named and FlashInfer's paths;
- serve (``vllm.general_plugins`` in the API-server process, ``serve_hook``): the same pins,
  the same identity from the final argv and environment, compared with the baked one, one
  verdict per cache kind in the log before the engine core starts, and one JSON line for the
  ``kernelbake serve`` supervisor, which checks it against what vLLM then did;
- ``kernelbake check`` (``check``): the same hook, driven by vLLM's own parser and config
  builder in this process, with the environment ``serve`` would give vLLM.

Imports vLLM; only runs where vLLM is installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.runtime.engines.vllm import compat_layer
from kernelbake.runtime.engines.vllm import identity as ident
from kernelbake.runtime.engines.vllm.evidence import PREDICTION_MARK as MARK
from kernelbake.runtime.prediction import Prediction, compile_off, predict

_CACHE_VARS = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE")


def baked_identity(manifest: Path) -> tuple[dict[str, Any] | None, set[str]]:
    """The build's identity and the cache kinds the bundle holds files of."""
    try:
        doc = jsondoc.loads(manifest.read_text())
    except (OSError, ValueError):
        return None, set()
    kinds = {str(f.get("kind")) for f in doc.get("files", [])}
    found = doc.get("compile_report", {}).get(ident.REPORT_KEY)
    return (found if isinstance(found, dict) else None), kinds


# vLLM's own record of what keyed a compiled graph, beside it: rank_R_D/PREFIX/.
FACTORS_FILE = "cache_key_factors.json"


def engine_factors_baked(vllm_cache: Path) -> dict[str, Any] | None:
    """The first readable ``cache_key_factors.json`` vLLM wrote under its baked cache (rank
    0's model first, by path), with ``file`` its path under ``vllm_cache``; None without one."""
    for path in sorted(vllm_cache.glob(f"torch_compile_cache/*/rank_*/*/{FACTORS_FILE}")):
        try:
            doc = jsondoc.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            return {"file": path.relative_to(vllm_cache).as_posix(), **doc}
    return None


def with_engine_factors(baked: Mapping[str, Any]) -> dict[str, Any]:
    """``baked`` with the engine's own factors file from the cache this start reads, where the
    release can compute the same factors now (``VllmLookups.cache_key_factors``)."""
    root = os.environ.get("VLLM_CACHE_ROOT")
    found = engine_factors_baked(Path(root)) if root and compat_layer.lookups().cache_key_factors else None
    return {**baked, "engine_factors": found} if found else dict(baked)


def now_identity(vllm_config: Any, baked: Mapping[str, Any] | None) -> dict[str, Any]:
    cache_env = {k: os.environ[k] for k in _CACHE_VARS if k in os.environ}
    doc = ident.identity(vllm_config, cache_env)
    if baked is not None:
        doc["code_files"] = ident.code_digests(sorted(baked.get("code_files", {})))
        doc["ninja_paths_missing"] = [p for p in baked.get("ninja_paths", []) if not Path(p).exists()]
        factors = baked.get("engine_factors")
        compute = compat_layer.lookups().cache_key_factors
        if isinstance(factors, Mapping) and compute is not None:
            paths = [f["path"] for f in factors.get("code", {}).get("files", []) if "path" in f]
            try:
                doc["engine_factors"] = compute(vllm_config, paths)
            except Exception as exc:  # the recorded identity still answers; say why not this
                doc["engine_factors_error"] = f"{type(exc).__name__}: {exc}"
    return doc


# -- build ---------------------------------------------------------------------------------


def record_at_build(report: MutableMapping[str, Any], pins: Mapping[str, Any]) -> None:
    """``pins``: the Inductor options the compile-only argv fixed (``args.with_pins``)."""

    def on_config(_engine_args: Any, config: Any) -> None:
        if ident.REPORT_KEY in report:
            return
        cache_env = {k: os.environ[k] for k in _CACHE_VARS if k in os.environ}
        try:
            report[ident.REPORT_KEY] = {**ident.identity(config, cache_env), "pins": dict(pins)}
        except Exception as exc:
            # The caches are still good; serve then falls back to the key, and says so.
            report["engine_identity_error"] = f"{type(exc).__name__}: {exc}"

    ident.install_hook(on_config)
    ident.record_traced_files(report)


def finish_at_build(report: MutableMapping[str, Any]) -> None:
    """After the engine ran: what only a run shows (traced files, directories vLLM named)."""
    doc = report.get(ident.REPORT_KEY)
    if not isinstance(doc, dict):
        return
    traced = set(report.get("traced_files", []))
    for rank in report.get("ranks", []):
        traced |= set(rank.pop("traced_files", []))
    doc["code_files"] = ident.code_digests(sorted(traced))
    if root := os.environ.get("VLLM_CACHE_ROOT"):
        doc["dirs"] = ident.compile_dirs(Path(root))
    if base := os.environ.get("FLASHINFER_WORKSPACE_BASE"):
        doc["ninja_paths"] = ident.ninja_paths(Path(base))
    report.pop("traced_files", None)


# -- serve and check -------------------------------------------------------------------


def _baked(manifest: Path) -> tuple[dict[str, Any], set[str]]:
    """``baked_identity`` with vLLM's own factors beside it, for a prediction (serve's and
    ``check``'s); LookupError where the build recorded none."""
    baked, kinds = baked_identity(manifest)
    if baked is None:
        raise LookupError(f"{manifest} records no engine identity (built by an older kernelbake)")
    return with_engine_factors(baked), kinds


def _judge(config: Any, manifest: Path) -> Prediction:
    baked, kinds = _baked(manifest)
    return predict(baked, now_identity(config, baked), kinds)


def _text(prediction: Prediction) -> str:
    lines = [f"kernelbake: {line}" for line in prediction.lines()]
    return "\n".join([*lines, MARK + json.dumps(prediction.to_json(), sort_keys=True)]) + "\n"


def _verdict_text(config: Any, manifest: Path) -> str:
    try:
        return _text(_judge(config, manifest))
    except Exception as exc:  # a prediction must never stop the server
        return f"kernelbake: no prediction: {type(exc).__name__}: {exc}\n"


def _detached(work: Callable[[], str]) -> None:
    """Runs ``work`` in a grandchild of this process and writes what it returns to stderr in
    one write, then returns at once. vLLM's API server forks or spawns its engine core right
    after building its config; computing the prediction there first (Inductor's and Triton's
    source hashes, the device facts) held the engine core back by over a second on every warm
    start. The grandchild is a copy of the server at this point, so it computes the same
    identity. Its device facts come, as in ``kernelbake check``, from a child of its own
    (``identity._device_side``), which initialises torch's CUDA state to read device
    properties: that creates no CUDA context and takes no GPU memory, so the engine core,
    which snapshots free GPU memory about a second after it starts, cannot see it come and go.
    It never returns into vLLM's code. The intermediate child exits at once and is reaped
    here, so the server gains no zombie."""
    if not hasattr(os, "fork"):
        sys.stderr.write(work())
        sys.stderr.flush()
        return
    # Output still buffered here would otherwise be written a second time by the copy.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        return
    try:  # pragma: no cover - runs in the forked copies
        if os.fork() == 0:
            data = work().encode(errors="replace")
            # One write: a pipe keeps it whole up to PIPE_BUF, and in practice beyond while
            # the reader (kernelbake serve) keeps the pipe drained.
            while data:
                data = data[os.write(2, data) :]
    finally:
        os._exit(0)


def serve_hook(manifest: Path) -> None:
    """In vLLM's API server: the verdict, per kind, once vLLM built its config, stated by a
    detached copy of the server so that the engine core starts meanwhile."""
    done: list[bool] = []

    def on_config(_engine_args: Any, config: Any) -> None:
        if done:
            return
        done.append(True)
        _detached(lambda: _verdict_text(config, manifest))

    ident.install_hook(on_config)


def check(serve_argv: Sequence[str], manifest: Path, *, trace: bool = True) -> Prediction:
    """``kernelbake check``: vLLM's parser and config builder in this process, with the
    environment already set as ``serve`` sets it for vLLM. Where Inductor keys the compiled
    graphs itself (the CPU build) and ``trace``, the model is traced and Inductor asked
    (``trace.ask_inductor``: one start-up up to the first forward)."""
    from kernelbake.runtime.engines.vllm.compat_layer import lookups, parse_serve_argv

    engine_args = parse_serve_argv(serve_argv)
    config = engine_args.create_engine_config(usage_context=lookups().api_server_usage())
    baked, kinds = _baked(manifest)
    now = now_identity(config, baked)
    if trace and now.get("graphs") == "inductor" and "inductor" in kinds and not compile_off(baked, now)[0]:
        from kernelbake.runtime.engines.vllm.trace import ask_inductor

        # The directory Inductor itself would read (identity.compile_state).
        now["inductor_trace"] = ask_inductor(engine_args, Path(now["compile"]["dirs"]["inductor"]))
    return predict(baked, now, kinds)
