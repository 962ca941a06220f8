"""This machine's side of the snapshot key: what a restore here would meet (the driver's
facts, the kernel, CRIU and its check, the CPU), measured by small probes tests replace."""

from __future__ import annotations

import dataclasses
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


def mem_available(meminfo: Path = _MEMINFO) -> int | None:
    """The kernel's ``MemAvailable``, in bytes (the node's, also in a container); None where it
    cannot be read."""
    try:
        return next(
            int(line.split()[1]) * 1024
            for line in meminfo.read_text().splitlines()
            if line.startswith("MemAvailable:")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None


@dataclasses.dataclass(frozen=True)
class CgroupMemory:
    """The container's memory limit and what is charged to it, in bytes."""

    limit: int
    used: int
    # Its page cache less tmpfs (``memory.stat``; 0 where that cannot be read): charged, but the
    # kernel reclaims it before it kills anything.
    reclaimable: int


# cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit number.
_V1_UNLIMITED = 1 << 62


def cgroup_memory(cgroup: Path = _CGROUP) -> CgroupMemory | None:
    """The container's memory limit, from cgroup v2's files or else v1's (Docker on a v1 host
    mounts the container's own under ``memory/``); None without a limit of its own or where
    they cannot be read."""
    if (cgroup / "memory.max").exists():
        where, limit_file, used_file, cache = cgroup, "memory.max", "memory.current", "file"
    else:
        where, limit_file, used_file, cache = (
            cgroup / "memory",
            "memory.limit_in_bytes",
            "memory.usage_in_bytes",
            "cache",
        )
    try:
        limit_text, used = (where / limit_file).read_text().strip(), int((where / used_file).read_text())
    except (OSError, ValueError):
        return None
    if not limit_text.isdigit() or int(limit_text) >= _V1_UNLIMITED:
        return None  # v2's "max", v1's huge number: no limit of its own
    try:
        stat_text = (where / "memory.stat").read_text()
        stat = dict(line.split()[:2] for line in stat_text.splitlines() if line.strip())
        reclaimable = max(int(stat.get(cache, 0)) - int(stat.get("shmem", 0)), 0)
    except (OSError, ValueError):
        reclaimable = 0
    return CgroupMemory(limit=int(limit_text), used=used, reclaimable=reclaimable)


def memory_room(meminfo: Path = _MEMINFO, cgroup: Path = _CGROUP) -> int | None:
    """The memory a restore can have here, in bytes: ``MemAvailable`` and, in a container with
    a memory limit, no more than the limit leaves, its page cache counted as room (the gate's
    own hashing fills it), tmpfs not. None where MemAvailable cannot be read: then nothing is
    checked."""
    if (node := mem_available(meminfo)) is None:
        return None
    if (limited := cgroup_memory(cgroup)) is None:
        return node
    return max(0, min(node, limited.limit - limited.used + limited.reclaimable))
