"""``check``'s trace on vLLM's CPU build, with stand-ins for Inductor's steps and vLLM's engine:
what Inductor did is noted, and Inductor, the environment and the private cache copy are as
they were after each way the start ends. (The real trace runs in the CPU image's tests.)"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelbake.runtime.engines.vllm import compat_layer, trace


class _Graph:
    def __init__(self, nodes: int) -> None:
        self.graph = types.SimpleNamespace(nodes=list(range(nodes)))


@pytest.fixture
def inductor(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.SimpleNamespace]:
    """Stand-ins for the three torch._inductor modules the trace patches."""

    def codegen(gm: Any) -> str:
        return "code"

    def compile_fx(gm: Any) -> str:
        return "compiled"

    class FxGraphCache:
        @staticmethod
        def prepare_key(*args: Any) -> tuple[Any, Any]:
            return ("fxkey",), {}

    class CppBuilder:
        _name = "kernel_0"

        def build(self) -> str:
            return "built"

    cfx = types.ModuleType("torch._inductor.compile_fx")
    cfx.fx_codegen_and_compile = codegen  # type: ignore[attr-defined]
    cfx.compile_fx = compile_fx  # type: ignore[attr-defined]
    modules = {
        "torch": types.ModuleType("torch"),
        "torch._inductor": types.ModuleType("torch._inductor"),
        "torch._inductor.compile_fx": cfx,
        "torch._inductor.codecache": types.SimpleNamespace(FxGraphCache=FxGraphCache),
        "torch._inductor.cpp_builder": types.SimpleNamespace(CppBuilder=CppBuilder),
    }
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    yield types.SimpleNamespace(
        cfx=cfx,
        FxGraphCache=FxGraphCache,
        CppBuilder=CppBuilder,
        originals=(codegen, FxGraphCache.__dict__["prepare_key"], CppBuilder.__dict__["build"]),
    )


def _engine(monkeypatch: pytest.MonkeyPatch, start: Callable[[], None]) -> list[dict[str, str | None]]:
    """vLLM's engine class as the lookups give it: ``start`` is its start-up; what the
    environment said during it is returned."""
    seen: list[dict[str, str | None]] = []

    class Engine:
        @classmethod
        def from_engine_args(cls, args: Any, usage_context: Any) -> Any:
            seen.append(
                {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "VLLM_ENABLE_V1_MULTIPROCESSING")}
            )
            start()
            return types.SimpleNamespace(engine_core=types.SimpleNamespace(shutdown=lambda: None))

    lookups = types.SimpleNamespace(engine_class=lambda: Engine, api_server_usage=lambda: "usage")
    monkeypatch.setattr(compat_layer, "lookups", lambda: lookups)
    return seen


def _forward(ind: types.SimpleNamespace, *, cached: bool) -> Callable[[], None]:
    """The model's first forward: Dynamo hands the graph to Inductor, which looks it up and,
    unless ``cached``, generates its code and builds a kernel; errors arrive wrapped."""

    def start() -> None:
        try:
            ind.cfx.compile_fx(_Graph(7))
        except Exception as exc:
            raise RuntimeError("wrapped by Dynamo") from exc

    def compile_fx(gm: Any) -> str:
        ind.FxGraphCache.prepare_key(gm)
        if not cached:
            ind.cfx.fx_codegen_and_compile(gm)
            ind.CppBuilder().build()
        return "compiled"

    ind.originals_compile = compile_fx
    ind.cfx.compile_fx = compile_fx
    return start


def _restored(ind: types.SimpleNamespace, tmp_path: Path) -> None:
    assert ind.cfx.fx_codegen_and_compile is ind.originals[0]
    assert ind.cfx.compile_fx is ind.originals_compile
    assert ind.FxGraphCache.__dict__["prepare_key"] is ind.originals[1]
    assert ind.CppBuilder.__dict__["build"] is ind.originals[2]
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ


def test_a_kernel_that_would_compile_is_named_and_everything_is_put_back(
    inductor: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    baked = tmp_path / "inductor"
    (baked / "fxgraph").mkdir(parents=True)
    seen = _engine(monkeypatch, _forward(inductor, cached=False))
    args = types.SimpleNamespace()
    answer = trace.ask_inductor(args, baked)
    assert {k: v for k, v in answer.items() if k != "took_s"} == {
        "key": "fxkey",
        "codegen": True,
        "graph_nodes": 7,
        "compiled": True,
        "kernel": "kernel_0",
    }
    (env,) = seen
    copy = Path(str(env["TORCHINDUCTOR_CACHE_DIR"]))
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and copy.name == "inductor" and copy != baked
    assert not copy.exists() and (baked / "fxgraph").is_dir()  # the copy is gone, the baked one stays
    assert (args.load_format, args.kv_cache_memory_bytes) == ("dummy", 64 << 20)
    _restored(inductor, tmp_path)


def test_a_graph_both_caches_hold_compiles_nothing(
    inductor: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    _engine(monkeypatch, _forward(inductor, cached=True))
    answer = trace.ask_inductor(types.SimpleNamespace(), tmp_path / "none")
    assert (answer["compiled"], "codegen" in answer, "error" in answer) == (False, False, False)
    _restored(inductor, tmp_path)


def test_a_start_that_fails_before_inductor_is_asked_says_why(
    inductor: types.SimpleNamespace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/before")
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)

    def start() -> None:
        raise ValueError("no such model")

    inductor.originals_compile = inductor.cfx.compile_fx
    _engine(monkeypatch, start)
    answer = trace.ask_inductor(types.SimpleNamespace(), tmp_path / "none")
    assert answer["error"] == "ValueError: no such model" and "compiled" not in answer
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/before"
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    _restored(inductor, tmp_path)
