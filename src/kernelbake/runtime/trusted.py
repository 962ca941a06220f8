"""Whether the files ``serve`` trusts are still the image's own where it reads them.

target.json and the pinned manifest (``layout.TRUSTED_FILES``) decide which caches start warm;
the signature covers them only as the image's layers hold them. A pod can put other bytes at
those paths without touching a layer: a volume at ``/opt/kernelbake`` or above (podman's
read-only image volume included), or a single file mounted over one of them. So before the
pinned manifest vouches for anything, each trusted file and every directory above it, up to
``/``, must be

- no mount point, as ``/proc/self/mountinfo`` lists them (``st_dev`` comparisons miss a bind
  mount from the same filesystem); ``/`` itself is the container's root, the image;
- no symlink, owned by root (an image's files are, unless its build said otherwise), writable
  by neither group nor others, and not writable by the uid that serves.

Anything else: the baked caches are not used and the start is cold, exactly as for a manifest
the image does not pin (``runtime.pin``), with a line naming the path and why. None of this
runs under ``$KERNELBAKE_UNSAFE_TARGET`` (the files are then not the image's by definition), and
the verdict says so instead (``preflight``).

The probes are small private functions that tests replace.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from kernelbake.contract.layout import TRUSTED_FILES

MOUNTINFO = "/proc/self/mountinfo"
_OCTAL = re.compile(r"\\([0-7]{3})")
_FIX = "mount nothing at or above them (the caches' volume belongs at the cache root)"


def _mountinfo() -> str:
    return Path(MOUNTINFO).read_text(encoding="utf-8", errors="surrogateescape")


def _lstat(path: str) -> os.stat_result:
    return os.lstat(path)


def _euid() -> int:
    return os.geteuid()


def _writable(path: str) -> bool:
    return os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids)


def mount_points(text: str) -> frozenset[str]:
    """The mount points of a mountinfo text (its fifth field, octal escapes decoded)."""
    found = set()
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            found.add(_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4]))
    return frozenset(found)


def _mounts(replaced: str) -> frozenset[str] | str:
    """This process's mount points; where they cannot be read, why whether a mount of the pod
    replaced ``replaced`` is unknown."""
    try:
        return mount_points(_mountinfo())
    except OSError as exc:
        return f"{MOUNTINFO} cannot be read ({exc.strerror}), so whether a mount of the pod replaced {replaced} is unknown"


def _chain(path: str) -> list[str]:
    """``path`` and every directory above it, ``/`` last."""
    out = [posixpath.normpath(path)]
    while out[-1] != "/":
        out.append(posixpath.dirname(out[-1]))
    return out


def _covers(where: str, files: Sequence[str]) -> str:
    covered = [f for f in files if f == where or f.startswith(where.rstrip("/") + "/")]
    return f"{' and '.join(covered)} {'come' if len(covered) > 1 else 'comes'}"


def _owner_problem(path: str, euid: int) -> str | None:
    try:
        st = _lstat(path)
    except FileNotFoundError:
        # A missing pinned manifest is runtime.pin's to judge; a missing target fails to load.
        return None
    except OSError as exc:
        return f"{path} cannot be inspected ({exc.strerror})"
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symlink, which the image's own files are not"
    if st.st_uid != 0:
        return f"{path} is owned by uid {st.st_uid}, not by root as the image's files are"
    if mode & 0o022:
        return f"{path} is writable by group or others (mode {mode:o})"
    if euid != 0 and _writable(path):
        return f"{path} is writable by uid {euid}, which serves"
    return None


def untrusted(files: Iterable[str] = TRUSTED_FILES) -> list[str]:
    """Why the trusted ``files`` cannot be taken as the image's (empty when they can)."""
    files = [posixpath.normpath(f) for f in files]
    chain = list(dict.fromkeys(p for f in files for p in _chain(f)))
    mounts = _mounts(" and ".join(files))
    if isinstance(mounts, str):
        return [mounts]
    problems = [
        f"{p} is a mount point ({MOUNTINFO}), so {_covers(p, files)} from what the pod mounted there, "
        f"not from the image; {_FIX}"
        for p in chain
        if p != "/" and p in mounts
    ]
    euid = _euid()
    problems += [why for p in chain if (why := _owner_problem(p, euid)) is not None]
    return problems


def mounts_inside(root: str | Path) -> list[str]:
    """Why the files under ``root`` (the cache delta's mount) may not all be its own: a mount
    point strictly inside it (``root`` itself is the delta's image volume), such as a file
    mounted by ``subPath`` over its delta.json; empty when there is none."""
    top = posixpath.normpath(str(root))
    mounts = _mounts(f"files of {top}")
    if isinstance(mounts, str):
        return [mounts]
    return [
        f"{m} is a mount point ({MOUNTINFO}) inside the delta, so its files are not all the delta's own; "
        f"mount the delta at {top} whole and nothing inside it"
        for m in sorted(mounts)
        if m.startswith(top.rstrip("/") + "/")
    ]
