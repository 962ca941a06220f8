"""Engines behind one small Protocol; the registry is a dict from ``Engine`` to a factory."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kernelbake.key import Engine
from kernelbake.runtime.bundle import CacheKind
from kernelbake.runtime.config import TargetConfig

if TYPE_CHECKING:
    from kernelbake.runtime.prediction import Prediction


@dataclasses.dataclass(frozen=True, kw_only=True)
class Facts:
    """What a probe of the running environment found; ``none`` where not applicable."""

    engine_version: str
    torch: str
    triton: str
    cuda: str
    flashinfer: str
    python: str
    arch: str
    device: str
    driver: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompileResult:
    kinds: tuple[CacheKind, ...]
    hashed_env: Mapping[str, str]
    report: Mapping[str, Any]


class EngineRuntime(Protocol):
    engine: Engine
    # Cache kinds this engine may produce; each gets its own layer in the final image.
    cache_kinds: tuple[CacheKind, ...]

    def probe(self) -> Facts: ...

    def cache_env(self, root: Path) -> dict[str, str]:
        """Environment variables that point the engine at the caches under ``root``."""
        ...

    def hashed_env_names(self) -> tuple[str, ...]:
        """Environment variables the engine folds into its compile hash."""
        ...

    def compile(self, target: TargetConfig, root: Path) -> CompileResult: ...

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        """The engine's command line for serving this target, with the user's extra args."""
        ...

    def shape_args(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        """User arguments that would change what was compiled, each with why (to warn about)."""
        ...

    def predict(
        self, target: TargetConfig, user_args: Sequence[str], env: Mapping[str, str]
    ) -> Prediction | None:
        """The engine's own verdict per cache kind, computed by the engine's code with the
        environment ``serve`` would give it; ``None`` when the engine cannot be asked."""
        ...

    def prediction_env(self, baked_root: Path) -> dict[str, str]:
        """Variables that make the engine log its own prediction as it starts (may be empty)."""
        ...

    def serve_watcher(self, cache_root: Path) -> Callable[[str], str | None] | None:
        """Reads the engine's output while it serves and returns a line to report when the
        engine says whether it used the caches under ``cache_root``; ``None``: nothing to
        read, so ``serve`` execs the engine instead of supervising it."""
        ...


_FACTORIES: dict[Engine, str] = {
    Engine.TORCH: "kernelbake.runtime.engines.torch_engine:TorchEngine",
    Engine.VLLM: "kernelbake.runtime.engines.vllm:VllmEngine",
}


def get_engine(engine: Engine) -> EngineRuntime:
    module, _, attr = _FACTORIES[engine].partition(":")
    factory: Callable[[], EngineRuntime] = getattr(importlib.import_module(module), attr)
    return factory()
