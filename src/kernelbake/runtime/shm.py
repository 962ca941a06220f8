"""Shared memory (``/dev/shm``) against what the engine needs, before anything starts.

Docker and podman give a container 64 MiB of ``/dev/shm``; vLLM's multiprocess executor puts
its message queues there and dies tens of seconds into its start when they do not fit, after
the preflight said the caches are valid. ``serve`` asks the engine for its need (the engine's
adapter reads it from the engine's own installed code) and compares it with the free space of
``/dev/shm`` first, so a start that cannot work fails in its first second with the flag to add.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from kernelbake.errors import EnvironmentProblem

SHM_PATH = Path("/dev/shm")
MIB = 1 << 20
GIB = 1 << 30
# What the docs run with (README, docs/serving.md, deploy/examples/serve.yaml's sizeLimit): the
# flag the error suggests is never below it, so the message and the pages say the same.
DOCS_SHM_GIB = 2


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShmNeed:
    """Bytes of ``/dev/shm`` an engine start needs, what for, and where the number came from."""

    engine: str
    bytes: int
    what: str
    source: str

    def flag(self) -> str:
        """The ``--shm-size`` that fits, in whole GiB (what one types, with headroom), at least the
        docs' size."""
        return f"--shm-size={max(DOCS_SHM_GIB, -(-self.bytes // GIB))}g"


def free_bytes(path: Path = SHM_PATH) -> int | None:
    """Free bytes of the filesystem at ``path``; ``None`` where there is no such directory
    (the engine then does without, as vLLM's own check does)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def require(need: ShmNeed | None, path: Path = SHM_PATH) -> None:
    """Raise ``EnvironmentProblem`` (exit 3) when ``path`` has less free space than ``need``."""
    if need is None:
        return
    free = free_bytes(path)
    if free is None or free >= need.bytes:
        return
    raise EnvironmentProblem(
        f"{path} has {free // MIB} MiB free; {need.engine} needs >= {-(-need.bytes // MIB)} MiB "
        f"for {need.what} ({need.source}): add `{need.flag()}` (docker/podman) or `--ipc=host`, "
        f"or an emptyDir with medium: Memory at {path} (Kubernetes)"
    )
