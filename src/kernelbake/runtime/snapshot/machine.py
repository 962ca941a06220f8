"""This machine's side of the snapshot key: what a restore here would meet (the driver's
facts, the kernel, CRIU and its check, the CPU), measured by small probes tests replace."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Mapping, Sequence
from pathlib import Path

from kernelbake.contract.key import CacheKey
from kernelbake.contract.snapshot import (
    UNLIMITED,
    SnapshotKey,
    Weights,
    capability_names,
    env_digest,
    is_volatile,
)
from kernelbake.runtime.snapshot.criu import Criu
from kernelbake.runtime.snapshot.driver import Driver

_CPUINFO = Path("/proc/cpuinfo")
_MEMINFO = Path("/proc/meminfo")
_CGROUP = Path("/sys/fs/cgroup")


# CAP_SYS_RESOURCE's bit in /proc/PID/status's CapEff: with it CRIU may raise a hard limit.
_CAP_SYS_RESOURCE = 24


def hard_rlimits(pid: int | None = None) -> dict[str, int]:
    """Every hard resource limit of ``pid`` (this process without one), by name without
    ``RLIMIT_`` (``NOFILE``), ``UNLIMITED`` for none."""
    found: dict[str, int] = {}
    for name in sorted(n for n in dir(resource) if n.startswith("RLIMIT_") and n != "RLIMIT_OFILE"):
        which = getattr(resource, name)
        hard = (resource.getrlimit(which) if pid is None else resource.prlimit(pid, which))[1]
        found[name.removeprefix("RLIMIT_")] = UNLIMITED if hard == resource.RLIM_INFINITY else hard
    return found


def _status_masks(status: Path, fields: Sequence[str]) -> int | None:
    """The union of ``fields`` (``CapEff``) of a ``/proc/PID/status``; None where it cannot be read."""
    try:
        lines = status.read_text().splitlines()
        found = [int(line.split()[1], 16) for line in lines if line.split(":")[0] in fields]
    except (OSError, ValueError, IndexError):
        return None
    mask = 0
    for m in found:
        mask |= m
    return mask if found else None


def may_raise_rlimits(status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process holds CAP_SYS_RESOURCE (CRIU, its child, may then raise limits)."""
    return bool((_status_masks(status, ("CapEff",)) or 0) >> _CAP_SYS_RESOURCE & 1)


def held_capabilities(pids: Sequence[int], proc: Path = Path("/proc")) -> tuple[str, ...]:
    """Every capability a process of ``pids`` holds (permitted, effective or inheritable)."""
    mask = 0
    for pid in pids:
        mask |= _status_masks(proc / str(pid) / "status", ("CapPrm", "CapEff", "CapInh")) or 0
    return capability_names(mask)


def grantable_capabilities(status: Path = Path("/proc/self/status")) -> tuple[str, ...] | None:
    """What a process CRIU restores here may be given: this container's bounding set (CRIU runs
    as root, whose permitted set after exec is the bounding set). None where it cannot be read."""
    mask = _status_masks(status, ("CapBnd",))
    return None if mask is None else capability_names(mask)


def kernel_release() -> str:
    return os.uname().release


def cpu(cpuinfo: Path = _CPUINFO) -> tuple[str, str]:
    """(model name, flags) of the first CPU in ``/proc/cpuinfo``."""
    model, flags = "unknown", "unknown"
    try:
        text = cpuinfo.read_text()
    except OSError:
        return model, flags
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name" and model == "unknown":
            model = value.strip() or model
        elif name.strip() == "flags" and flags == "unknown":
            flags = value.strip() or flags
    return model, flags


def serve_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the key holds: everything but what each container, pod or node sets
    (``contract.snapshot.VOLATILE_ENV``)."""
    return {k: v for k, v in environ.items() if not is_volatile(k)}


def here_key(
    *,
    image: str,
    cache_key: CacheKey,
    argv: Sequence[str],
    environ: Mapping[str, str],
    driver: Driver,
    criu: Criu,
    weights: Weights = Weights.INSIDE,
    cpuinfo: Path = _CPUINFO,
) -> SnapshotKey:
    """The key a snapshot taken (or restored) here, of this engine command, has."""
    facts = driver.facts()
    model, flags = cpu(cpuinfo)
    return SnapshotKey(
        image=image,
        cache_key=cache_key,
        gpu=facts.gpu,
        gpu_count=facts.gpu_count,
        driver=facts.driver,
        cuda_driver_api=facts.cuda_driver_api,
        kernel=kernel_release(),
        criu=criu.version(),
        criu_features=criu.features(),
        cpu=model,
        cpu_flags=flags,
        serve_args=json.dumps(list(argv)),
        serve_env=env_digest(serve_env(environ)),
        weights=weights,
    )


def memory_room(meminfo: Path = _MEMINFO, cgroup: Path = _CGROUP) -> int | None:
    """The memory a restore can have here, in bytes: the kernel's ``MemAvailable`` and, in a
    container with a memory limit, no more than the limit leaves. The container's page cache
    counts as room (file pages less tmpfs: the kernel reclaims them before it kills anything;
    the gate's own hashing fills it), tmpfs does not. None where MemAvailable cannot be read:
    then nothing is checked."""
    try:
        node = next(
            int(line.split()[1]) * 1024
            for line in meminfo.read_text().splitlines()
            if line.startswith("MemAvailable:")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    left = _limit_leaves(cgroup)
    return node if left is None else max(0, min(node, left))


# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit number.
_V1_UNLIMITED = 1 << 62


def _limit_leaves(cgroup: Path) -> int | None:
    """What the container's memory limit leaves, page cache counted, from cgroup v2's files or
    else v1's (Docker on a v1 host mounts the container's own under ``memory/``); None without
    a limit or where they cannot be read."""
    v1 = cgroup / "memory"
    if (cgroup / "memory.max").exists():
        files, cache = ("memory.max", "memory.current", "memory.stat"), "file"
        where = cgroup
    else:
        files, cache = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat"), "cache"
        where = v1
    try:
        limit_text, used_text, stat_text = ((where / f).read_text() for f in files)
        stat = dict(line.split()[:2] for line in stat_text.splitlines() if line.strip())
        reclaimable = max(int(stat.get(cache, 0)) - int(stat.get("shmem", 0)), 0)
        if not limit_text.strip().isdigit() or int(limit_text) >= _V1_UNLIMITED:
            return None  # v2's "max", v1's huge number: no limit of its own
        return int(limit_text) - int(used_text) + reclaimable
    except (OSError, ValueError):
        return None
