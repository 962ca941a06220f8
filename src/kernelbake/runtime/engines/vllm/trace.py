"""``kernelbake check`` on vLLM's CPU build: trace the model and ask Inductor whether the
graph is in the baked cache (imports vLLM; only runs where it is installed).

With AOT compile off (the CPU build, docs/vllm.md) vLLM hands the traced graph to stock
Inductor, which keys its AOTAutograd and FX-graph caches on that graph and on its own config,
not on vLLM's config hash: a changed ``--max-model-len`` traces the same graph and compiles
nothing, a patched model file may trace another one. Neither can be read off vLLM's identity,
so this asks Inductor itself. vLLM starts in this process as ``serve`` would start it (the same
engine arguments; vLLM's dummy weights and a small KV cache, neither in Inductor's key) up to
the model's first forward, where Dynamo traces it and hands the graph to Inductor. Inductor
looks it up in a private copy of the baked Inductor cache (a lookup that hits writes the
loaded module next to the entry, which must not happen in the baked directory). Where it
generates the graph's code again (a miss, or its FX-graph cache switched off), the kernels
that code needs load by their source's hash from that copy; the first one that is not there
is a C++ build, which is replaced by a recorder that stops the start: a kernel compiles.

Cost: one start-up up to the first forward (the model built with random weights in memory,
then the trace: about 20 s for the CPU default image on 2 cores) and a copy of the Inductor
cache directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# A small KV cache: the probe serves nothing (not in any compile key).
_KV_BYTES = 64 << 20


class _Answered(Exception):
    """Raised from inside Inductor once it has answered; unwinds vLLM's start-up."""


class _Recorders:
    """Inductor's steps, each replaced by one that notes what Inductor did into ``answer``
    while the start runs (``installed``), and put back after."""

    def __init__(self) -> None:
        import torch._inductor.compile_fx as cfx
        from torch._inductor.codecache import FxGraphCache
        from torch._inductor.cpp_builder import CppBuilder

        self.answer: dict[str, Any] = {}
        self._cfx, self._cache, self._builder = cfx, FxGraphCache, CppBuilder
        self._codegen, self._compile_fx = cfx.fx_codegen_and_compile, cfx.compile_fx
        self._prepare_key = FxGraphCache.__dict__["prepare_key"]
        self._build = CppBuilder.build

    def codegen(self, gm: Any, *args: Any, **kwargs: Any) -> Any:
        # The FX-graph cache did not hold the graph (or is off): Inductor generates its code
        # again. Whether a kernel then compiles is the C++ build's question (below); one whose
        # source is already in the cache loads by that source's hash.
        self.answer["codegen"] = True
        self.answer["graph_nodes"] = len(gm.graph.nodes)
        return self._codegen(gm, *args, **kwargs)

    def build(self, builder: Any, *args: Any, **kwargs: Any) -> Any:
        self.answer["compiled"] = True
        self.answer["kernel"] = str(getattr(builder, "_name", "") or type(builder).__name__)
        raise _Answered

    def key(self, *args: Any, **kwargs: Any) -> Any:
        key_info, cache_info = self._prepare_key.__func__(*args, **kwargs)
        # Not computed when AOTAutograd's own cache held the graph; a bypass says why.
        if key_info is not None:
            self.answer["key"] = str(key_info[0])
        elif isinstance(cache_info, dict) and cache_info.get("cache_bypass_reason"):
            self.answer["bypass"] = str(cache_info["cache_bypass_reason"])[:200]
        return key_info, cache_info

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        self._compile_fx(*args, **kwargs)
        # Inductor returned a compiled graph without generating code: both caches answered.
        self.answer.setdefault("compiled", False)
        raise _Answered

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        recorder = self

        def build(builder: Any, *args: Any, **kwargs: Any) -> Any:
            return recorder.build(builder, *args, **kwargs)

        self._cfx.fx_codegen_and_compile, self._cfx.compile_fx = self.codegen, self.compile
        self._cache.prepare_key = staticmethod(self.key)
        self._builder.build = build
        try:
            yield
        finally:
            self._cfx.fx_codegen_and_compile, self._cfx.compile_fx = self._codegen, self._compile_fx
            self._cache.prepare_key = self._prepare_key
            self._builder.build = self._build


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set, as it was after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _private_copy(inductor_dir: Path, work: Path) -> Path:
    """A copy of the baked Inductor cache: a lookup that hits writes beside the entry."""
    copy = work / "inductor"
    if inductor_dir.is_dir():
        shutil.copytree(inductor_dir, copy, symlinks=True)
    else:
        copy.mkdir()
    return copy


def ask_inductor(engine_args: Any, inductor_dir: Path) -> dict[str, Any]:
    """``{"compiled": bool, "codegen": bool, "took_s": …}``: whether a kernel compiles for the
    graph this start traces, and whether Inductor generated the graph's code again (seconds,
    no compile); ``{"error": …}`` when the start stopped before asking it."""
    from kernelbake.runtime.engines.vllm.compat_layer import lookups

    engine_class, usage = lookups().engine_class(), lookups().api_server_usage()
    started = time.monotonic()
    recorders = _Recorders()
    answer = recorders.answer
    work = Path(tempfile.mkdtemp(prefix="kernelbake-trace-"))
    try:
        # The engine core in this process, where the recorders are (not in vLLM's hash).
        env = _environ(
            TORCHINDUCTOR_CACHE_DIR=str(_private_copy(inductor_dir, work)), VLLM_ENABLE_V1_MULTIPROCESSING="0"
        )
        engine_args.load_format = "dummy"
        engine_args.kv_cache_memory_bytes = _KV_BYTES
        with env, recorders.installed():
            try:
                engine = engine_class.from_engine_args(engine_args, usage_context=usage)
                engine.engine_core.shutdown()
                answer.setdefault("error", "vLLM started without handing a graph to Inductor")
            except Exception as exc:  # _Answered arrives wrapped by Dynamo and vLLM
                if "compiled" not in answer:
                    answer["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    answer["took_s"] = round(time.monotonic() - started, 1)
    return answer
