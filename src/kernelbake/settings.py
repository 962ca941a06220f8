"""Host-side settings. ``Settings.from_env`` is the only reader of the environment on the host;
code inside images reads its own environment in ``kernelbake.runtime.env``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    # Where images go when no --push/--registry is given.
    registry: str = "127.0.0.1:5000/kernelbake"
    docker: str = "docker"
    build_dir: Path = Path("build")
    # The whole environment, passed through to the subprocesses we start (docker needs
    # DOCKER_HOST, DOCKER_CONFIG, proxies …), never read field by field elsewhere.
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = dict(os.environ if environ is None else environ)
        return cls(
            registry=env.get("KERNELBAKE_REGISTRY", cls.registry),
            docker=env.get("KERNELBAKE_DOCKER", cls.docker),
            build_dir=Path(env.get("KERNELBAKE_BUILD_DIR", str(cls.build_dir))),
            environ=env,
        )
