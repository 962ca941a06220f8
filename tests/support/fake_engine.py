"""An engine without torch: its compile writes a few files, its probe returns a given platform."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from kernelbake.contract.engines import EngineDeclaration
from kernelbake.contract.key import CacheKey, Engine
from kernelbake.contract.layout import MANIFEST, PINNED_MANIFEST_NAME, CacheKind, kind_dir
from kernelbake.contract.platform import Platform, Software
from kernelbake.contract.target import TargetConfig
from kernelbake.runtime.engines import CompileResult
from kernelbake.runtime.shm import ShmNeed


def platform_for(key: CacheKey, **changes: str) -> Platform:
    """The platform ``key`` was planned for (its driver floor installed, or none), with
    ``changes`` applied to any of its fields."""
    values = {**key.as_dict(), "driver": key.driver_floor, **changes}
    software = Software(**{f.name: values[f.name] for f in dataclasses.fields(Software)})
    return Platform(software=software, arch=values["arch"], device=values["device"], driver=values["driver"])


class FakeEngine:
    declaration = EngineDeclaration(
        engine=Engine.TORCH,
        cache_kinds=(CacheKind.INDUCTOR, CacheKind.TRITON),
        cache_variables=(("FAKE_CACHE_DIR", CacheKind.INDUCTOR), ("FAKE_HASHED", "1")),
        hashed_env=("FAKE_HASHED",),
    )

    def __init__(self, platform: Platform, *, files: int = 2) -> None:
        self.platform = platform
        self.files = files
        self.compiled_into: Path | None = None

    def probe(self) -> Platform:
        return self.platform

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

    # Whether the fake's serve command waits at the cache gate (tests that start it say so).
    gated = False

    def holds_at_gate(self, environ: Mapping[str, str]) -> bool:
        return self.gated

    def launch_env(self) -> dict[str, str]:
        return {}

    def snapshot_env(self) -> dict[str, str]:
        return {}

    # What the fake says it needs in /dev/shm (tests of serve's shared-memory check set it).
    shm: ShmNeed | None = None

    def shm_need(
        self, target: TargetConfig, user_args: Sequence[str], environ: Mapping[str, str]
    ) -> ShmNeed | None:
        return self.shm

    def serve_watcher(self, cache_root: Path) -> None:
        return None

    def predict(self, target: TargetConfig, user_args: Sequence[str], env: Mapping[str, str]) -> None:
        return None

    def prediction_env(self, baked_root: Path) -> dict[str, str]:
        return {}

    def shape_args(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return [f"{a} changes the shapes" for a in user_args if a.startswith("--shapes")]


def pin_manifest(target_file: Path) -> None:
    """What the image's final stage does after the compile: a copy of the cache manifest
    beside target.json, outside the cache root, which the runtime checks the manifest against."""
    config = TargetConfig.load(target_file)
    pinned = target_file.parent / PINNED_MANIFEST_NAME
    pinned.write_bytes((Path(config.cache_root) / MANIFEST).read_bytes())
