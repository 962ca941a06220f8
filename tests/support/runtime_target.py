"""A target planned from one of the repository's specs and written where the runtime reads it
(``KERNELBAKE_UNSAFE_TARGET``: the runtime outside an image), and the runtime environment that points at it: the set-up of the
runtime tests, once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kernelbake.contract.target import TargetConfig
from kernelbake.plan import plan
from kernelbake.render import target_config
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.spec import load_spec
from tests.conftest import REPO


def write_target(tmp_path: Path, spec: str) -> TargetConfig:
    """``images/<spec>`` planned for the CPU, its cache root under ``tmp_path``, written to
    ``tmp_path/target.json``."""
    (t,) = plan(load_spec(REPO / "images" / spec), ["cpu"])
    config = dataclasses.replace(target_config(t), cache_root=str(tmp_path / "cache"))
    (tmp_path / "target.json").write_text(config.to_json())
    return config


def runtime_env(tmp_path: Path, **environ: str) -> RuntimeEnv:
    """The runtime's environment for the target ``write_target`` wrote, scratch space under
    ``tmp_path``, and ``environ`` on top."""
    return RuntimeEnv.from_env(
        {
            "KERNELBAKE_UNSAFE_TARGET": str(tmp_path / "target.json"),
            "TMPDIR": str(tmp_path / "scratch"),
            **environ,
        }
    )
