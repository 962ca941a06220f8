"""The process tree a snapshot holds, read from ``/proc``: its pids, their commands, what each
holds that must not (or cannot) enter a snapshot. Every function takes the ``/proc`` root so
tests give a fake one."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from kernelbake.runtime.redact import is_secret, secret_flags

PROC = Path("/proc")
# /proc/net/tcp state column: 01 ESTABLISHED.
_ESTABLISHED = "01"
_GPU_DEVICES = "/dev/nvidia"


def _stat(proc: Path, pid: int) -> tuple[str, int] | None:
    """The process's state letter and parent pid, or None where it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    state, ppid = stat.rpartition(")")[2].split()[:2]
    return state, int(ppid)


def _ppid(proc: Path, pid: int) -> int | None:
    return None if (stat := _stat(proc, pid)) is None else stat[1]


def unreaped(pid: int, proc: Path = PROC) -> int | None:
    """The parent of ``pid`` where it has exited and that parent has not reaped it (it keeps
    its pid, and has no command line left), else None."""
    stat = _stat(proc, pid)
    return stat[1] if stat is not None and stat[0] == "Z" else None


def descendants(root: int, proc: Path = PROC) -> list[int]:
    """``root`` and every process below it, root first, then by pid."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (pp := _ppid(proc, int(entry.name))) is not None:
            children.setdefault(pp, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return out


def raise_pids(floor: int, proc: Path = PROC) -> None:
    """Use up pids until the next one is above ``floor`` (a fresh pid namespace starts at 1;
    ``ns_last_pid`` is read-only in a container). Each is a child that exits at once."""
    while True:
        try:
            last = int((proc / "sys/kernel/ns_last_pid").read_text())
        except (OSError, ValueError):
            return
        if last >= floor:
            return
        for _ in range(min(256, floor - last)):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)


def in_use(pids: Iterable[int], proc: Path = PROC) -> list[int]:
    """Those of ``pids`` that a process or a thread holds here (``/proc/<tid>`` answers for a
    thread too, though it is not listed)."""
    return [pid for pid in pids if (proc / str(pid)).exists()]


def cmdline(pid: int, proc: Path = PROC) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def environ(pid: int, proc: Path = PROC) -> dict[str, str]:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        name, eq, value = item.decode(errors="replace").partition("=")
        if eq:
            out[name] = value
    return out


def secrets(pid: int, proc: Path = PROC) -> list[str]:
    """The names (never the values) of what in ``pid``'s environment and argv carries a
    secret: redact's rule, the one logs follow."""
    found = [f"${name}" for name, value in environ(pid, proc).items() if is_secret(name) and value]
    argv = cmdline(pid, proc)
    flags = secret_flags(argv)
    return found + [f"argv {flag}" for flag in flags]


def io_urings(pid: int, proc: Path = PROC) -> list[str]:
    """``pid``'s file descriptors on an io_uring, which CRIU cannot dump."""
    return [fd for fd, link in _fds(pid, proc) if link == "anon_inode:[io_uring]"]


def gpu_files(pid: int, proc: Path = PROC) -> list[str]:
    """The GPU device files (``/dev/nvidia*``) ``pid`` holds open or mapped, sorted, each once.
    CRIU cannot dump one; the driver's checkpoint gives up those of a process it checkpoints."""
    found = {link for _fd, link in _fds(pid, proc) if link.startswith(_GPU_DEVICES)}
    try:
        maps = (proc / str(pid) / "maps").read_text(errors="replace")
    except OSError:
        maps = ""
    for line in maps.splitlines():
        # address perms offset dev inode [path]: the path is the sixth field, when there is one.
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(_GPU_DEVICES):
            found.add(parts[5])
    return sorted(found)


# What of a process's memory CRIU writes out (``smaps_rollup``, kB): its private anonymous pages
# (where the driver's checkpoint also put the process's device memory), those swapped out, and
# its share of shared memory; file pages stay in their files.
_DUMPED = ("Anonymous:", "Swap:", "Pss_Shmem:")


def dumped_bytes(pid: int, proc: Path = PROC) -> int:
    """About how many bytes a dump of ``pid`` writes for its memory (0 for one gone)."""
    try:
        rollup = (proc / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return 0
    total = 0
    for line in rollup.splitlines():
        if line.startswith(_DUMPED):
            total += int(line.split()[1]) * 1024
    return total


def catches(pid: int, signum: int, proc: Path = PROC) -> bool:
    """Whether ``pid`` has a handler of ``signum`` (``SigCgt`` in its status, a hex mask with
    bit ``signum - 1``): a signal it does not catch may end it."""
    try:
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _fds(pid: int, proc: Path) -> list[tuple[str, str]]:
    """(fd, link target) of ``pid``'s open files, by fd number; those gone meanwhile left out."""
    try:
        entries = sorted(
            (proc / str(pid) / "fd").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1
        )
    except OSError:
        return []
    out = []
    for entry in entries:
        try:
            out.append((entry.name, str(entry.readlink())))
        except OSError:
            continue
    return out


def socket_inodes(pid: int, proc: Path = PROC) -> set[str]:
    return {link[len("socket:[") : -1] for _fd, link in _fds(pid, proc) if link.startswith("socket:[")}


def clients(pids: list[int], port: int, proc: Path = PROC) -> int:
    """How many connections the tree has accepted on ``port`` and not closed (CRIU would need
    ``--tcp-established`` for them, and a restored replica must not carry another's client)."""
    if not pids:
        return 0
    inodes = set().union(*(socket_inodes(p, proc) for p in pids))
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / str(pids[0]) / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local_port = cols[1].rpartition(":")[2] if len(cols) > 9 else ""
            if cols[3:4] == [_ESTABLISHED] and local_port == f"{port:04X}" and cols[9] in inodes:
                count += 1
    return count
