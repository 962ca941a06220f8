"""An engine without torch: its compile writes a few files, its probe returns given facts."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from kernelbake.contract.engines import EngineDeclaration
from kernelbake.contract.key import CacheKey, Engine
from kernelbake.contract.layout import CacheKind, kind_dir
from kernelbake.contract.target import TargetConfig
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
    declaration = EngineDeclaration(
        engine=Engine.TORCH,
        cache_kinds=(CacheKind.INDUCTOR, CacheKind.TRITON),
        cache_variables=(("FAKE_CACHE_DIR", CacheKind.INDUCTOR), ("FAKE_HASHED", "1")),
        hashed_env=("FAKE_HASHED",),
    )

    def __init__(self, facts: Facts, *, files: int = 2) -> None:
        self.facts = facts
        self.files = files
        self.compiled_into: Path | None = None

    def probe(self) -> Facts:
        return self.facts

    def hashed_env_names(self) -> tuple[str, ...]:
        return self.declaration.hashed_env

    def compile(self, target: TargetConfig, root: Path) -> CompileResult:
        self.compiled_into = root
        for i in range(self.files):
            p = kind_dir(root, CacheKind.INDUCTOR) / f"g{i}" / "graph.bin"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(bytes([i]) * (100 + i))
        return CompileResult(kinds=self.declaration.cache_kinds, hashed_env={}, report={"graphs": self.files})

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return ["fake-serve", *user_args]

    def serve_watcher(self, cache_root: Path) -> None:
        return None

    def shape_args(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return [f"{a} changes the shapes" for a in user_args if a.startswith("--shapes")]
