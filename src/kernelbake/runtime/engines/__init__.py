"""Engines behind one small Protocol; the registry is a dict from ``Engine`` to a factory."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kernelbake.contract.engines import EngineDeclaration
from kernelbake.contract.key import Engine
from kernelbake.contract.layout import CacheKind
from kernelbake.contract.manifest import RankEntry
from kernelbake.contract.platform import Platform
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import EnvironmentProblem

if TYPE_CHECKING:
    from kernelbake.runtime.prediction import Prediction
    from kernelbake.runtime.shm import ShmNeed


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompileResult:
    kinds: tuple[CacheKind, ...]
    hashed_env: Mapping[str, str]
    report: Mapping[str, Any]
    # Each rank's own cache directories, for engines that run one worker per GPU.
    ranks: tuple[RankEntry, ...] = ()
    # Names of files the engine's libraries keep in their cache directories that are logs
    # they append to on every start, not caches: left in the bundle, left out of the manifest.
    logs: frozenset[str] = frozenset()


class EngineRuntime(Protocol):
    # Its cache kinds and the variables that point it at them, which the host renders too.
    declaration: EngineDeclaration

    def probe(self) -> Platform:
        """The platform this process runs on, measured through the engine's own libraries."""
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

    def holds_at_gate(self, environ: Mapping[str, str]) -> bool:
        """Whether the engine, started with ``environ``, waits at the cache gate
        (``runtime.gate``) before it opens any cache; ``serve`` then starts it while the
        caches are still being hashed, else only once they are verified."""
        ...

    def shm_need(
        self, target: TargetConfig, user_args: Sequence[str], environ: Mapping[str, str]
    ) -> ShmNeed | None:
        """How much ``/dev/shm`` serving with ``user_args`` and ``environ`` needs, asked of
        the installed engine without starting it (``serve`` checks it first); ``None``: none."""
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

    def launch_env(self) -> dict[str, str]:
        """Variables the engine starts faster with and that change nothing it compiles or
        serves; the environment the image runs with wins over each of them."""
        ...

    def snapshot_env(self) -> dict[str, str]:
        """Variables the engine must start with when ``snapshot take`` will dump its process
        tree: what keeps any process from holding device files CRIU cannot dump. They change
        nothing it compiles or serves, and win over the image's environment."""
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


def measure(engine: EngineRuntime) -> Platform:
    """The engine's probe; a broken engine install becomes one line, not a traceback."""
    try:
        return engine.probe()
    except Exception as exc:
        raise EnvironmentProblem(
            f"probing the {engine.declaration.engine.value} engine failed: {type(exc).__name__}: {exc}",
            hint="is the engine installed in this image?",
        ) from None
