"""Two stand-in GPU families on this machine (buildkit/test-fleet.sh), for the fleet test and
the bench: two more Docker daemons, each the builder of one family."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO
from tests.support.docker import CPU_BASE, require_cpu_base

SCRIPT = REPO / "buildkit" / "test-fleet.sh"
SPEC = REPO / "bench" / "specs" / "tiny-llama-fleet.yaml"


@contextlib.contextmanager
def two_daemons(workdir: Path) -> Iterator[dict[str, str]]:
    """The environment (DOCKER_CONFIG with the contexts kernelbake-test-a/-b) for builds that
    use them; both daemons are stopped and their state removed afterwards."""
    require_cpu_base()
    # Short: a unix socket path must stay under 108 bytes.
    root = Path("/tmp") / f"kbfleet-{os.getpid()}"
    try:
        done = subprocess.run(
            ["bash", str(SCRIPT), "up", str(root), CPU_BASE], capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            raise AssertionError(f"test-fleet.sh up failed:\n{done.stdout}\n{done.stderr}")
        yield {**os.environ, "DOCKER_CONFIG": str(root / "config")}
    finally:
        # Stopping two daemons and removing their data roots (each a copy of the base image)
        # took over two minutes on a loaded 2-core host.
        subprocess.run(["bash", str(SCRIPT), "down", str(root)], capture_output=True, timeout=900)
