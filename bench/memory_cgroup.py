"""A memory limit a bench can put a server under, as a kubelet does a container's
``resources.limits.memory``: a memory cgroup of its own (v2 where the unified hierarchy has the
memory controller, else v1), joined by the server's first process before it execs, so that
every process it forks is inside. Past the limit the kernel reclaims, then OOM-kills, exactly
as in the pod; the bench reads the cgroup's peak and its OOM kills afterwards.

Where no cgroup can be made (no root, a read-only /sys/fs/cgroup) ``limited`` yields a limit
that says so (``enforced`` false, ``why``): the bench then reports the limit as measured only."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


@dataclasses.dataclass
class Limit:
    limit_bytes: int
    enforced: bool
    why: str = ""
    version: int | None = None
    path: Path | None = None
    # Arguments to put before a command: it joins the cgroup, then execs the command.
    wrap: tuple[str, ...] = ()

    def stats(self) -> dict[str, object]:
        """The cgroup's figures so far: the peak of its usage (what the kernel holds against the
        limit: resident pages and page cache), how often the limit was hit, OOM kills."""
        out: dict[str, object] = {
            "enforced": self.enforced,
            "limit_bytes": self.limit_bytes,
            "cgroup_version": self.version,
        }
        if not self.enforced or self.path is None:
            return {**out, "why_not": self.why}
        if self.version == 2:
            events = _pairs(self.path / "memory.events")
            peak = self.path / "memory.peak"
            out |= {
                "peak_usage_bytes": int(peak.read_text()) if peak.exists() else None,
                "limit_hit": events.get("max", 0),
                "oom_kills": events.get("oom_kill", 0),
            }
        else:
            oom = _pairs(self.path / "memory.oom_control")
            out |= {
                "peak_usage_bytes": int((self.path / "memory.max_usage_in_bytes").read_text()),
                "limit_hit": int((self.path / "memory.failcnt").read_text()),
                "oom_kills": oom.get("oom_kill"),
            }
        return out


def _pairs(path: Path) -> dict[str, int]:
    pairs = (line.split() for line in path.read_text().splitlines())
    return {k: int(v) for k, v in (p for p in pairs if len(p) == 2)}


def _own(controller_root: Path, version: int) -> Path:
    """The cgroup this process is in, under ``controller_root`` (a child of it is ours to make)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if (version == 2 and controllers == "") or (version == 1 and "memory" in controllers.split(",")):
            return controller_root / path.lstrip("/")
    return controller_root


def _place(limit_bytes: int, name: str) -> tuple[int, Path]:
    for unified in (ROOT, ROOT / "unified"):
        controllers = unified / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split():
            path = _own(unified, 2) / name
            path.mkdir()
            (path / "memory.max").write_text(str(limit_bytes))
            if (path / "memory.swap.max").exists():
                # A pod has no swap: what does not fit is reclaimed or killed, not swapped.
                (path / "memory.swap.max").write_text("0")
            return 2, path
    v1 = ROOT / "memory"
    if not (v1 / "memory.limit_in_bytes").exists():
        raise OSError("no memory controller under /sys/fs/cgroup (v1 or v2)")
    path = _own(v1, 1) / name
    path.mkdir()
    (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
    return 1, path


@contextlib.contextmanager
def limited(limit_bytes: int, name: str | None = None) -> Iterator[Limit]:
    """A cgroup with ``limit_bytes`` for the processes started with ``Limit.wrap`` in front of
    their command; removed afterwards (its processes must have ended by then)."""
    name = name or f"kernelbake-bench-{os.getpid()}"
    try:
        version, path = _place(limit_bytes, name)
    except OSError as exc:
        yield Limit(limit_bytes, enforced=False, why=f"no memory cgroup could be made: {exc}")
        return
    procs = path / "cgroup.procs"
    wrap = ("sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs))
    try:
        yield Limit(limit_bytes, enforced=True, version=version, path=path, wrap=wrap)
    finally:
        with contextlib.suppress(OSError):
            path.rmdir()
