"""An engine without torch: its compile writes a few files, its probe returns given facts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from kernelbake.key import CacheKey, Engine
from kernelbake.runtime.bundle import CacheKind, kind_dir
from kernelbake.runtime.config import TargetConfig
from kernelbake.runtime.engines import CompileResult, Facts


def facts_for(key: CacheKey, **changes: str) -> Facts:
    """Facts that match ``key`` (driver = its floor, or none), with ``changes`` applied."""
    facts = Facts(
        engine_version=key.engine_version,
        torch=key.torch,
        triton=key.triton,
        cuda=key.cuda,
        flashinfer=key.flashinfer,
        python=key.python,
        arch=key.arch,
        device=key.device,
        driver=key.driver_floor,
    )
    return dataclasses.replace(facts, **changes)


class FakeEngine:
    engine = Engine.TORCH
    cache_kinds = (CacheKind.INDUCTOR, CacheKind.TRITON)

    def __init__(self, facts: Facts, *, files: int = 2) -> None:
        self.facts = facts
        self.files = files
        self.compiled_into: Path | None = None

    def probe(self) -> Facts:
        return self.facts

    def cache_env(self, root: Path) -> dict[str, str]:
        return {"FAKE_CACHE_DIR": str(kind_dir(root, CacheKind.INDUCTOR)), "FAKE_HASHED": "1"}

    def hashed_env_names(self) -> tuple[str, ...]:
        return ("FAKE_HASHED",)

    def compile(self, target: TargetConfig, root: Path) -> CompileResult:
        self.compiled_into = root
        for i in range(self.files):
            p = kind_dir(root, CacheKind.INDUCTOR) / f"g{i}" / "graph.bin"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(bytes([i]) * (100 + i))
        return CompileResult(kinds=self.cache_kinds, hashed_env={}, report={"graphs": self.files})

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return ["fake-serve", *user_args]

    def serve_watcher(self, cache_root: Path) -> None:
        return None

    def predict(self, target: TargetConfig, user_args: Sequence[str], env: Mapping[str, str]) -> None:
        return None

    def prediction_env(self, baked_root: Path) -> dict[str, str]:
        return {}

    def shape_args(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return [f"{a} changes the shapes" for a in user_args if a.startswith("--shapes")]


class FakeVllmEngine(FakeEngine):
    """Stands in for the vLLM engine module (another area) where only its declarations matter."""

    engine = Engine.VLLM
    cache_kinds = (CacheKind.VLLM, CacheKind.INDUCTOR, CacheKind.TRITON, CacheKind.FLASHINFER)

    def __init__(self) -> None:
        super().__init__(facts=None)  # type: ignore[arg-type]

    def cache_env(self, root: Path) -> dict[str, str]:
        return {"VLLM_CACHE_ROOT": str(kind_dir(root, CacheKind.VLLM))}
