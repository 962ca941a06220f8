"""Whether the snapshot root is an image volume the container runtime verified, so that the
gate may skip hashing its files (verified once per node, when the runtime pulled it).

A Kubernetes image volume is the artifact's layers, fetched by digest (the runtime checks every
blob's sha256 against the manifest admission verified and pinned) and unpacked once per node,
mounted as an overlay of those layers alone: no upper directory, read-only. Nothing in the pod
can write it, not even with SYS_ADMIN (an overlay without an upper layer has nowhere to write,
and the layers' directories are not in the container's mount namespace); only the runtime and
root on the node can, which can equally change the image's own files, kernelbake's gate among
them, that no start re-hashes either. So the files of such a mount are trusted as pulled; their
listing, types and sizes are still checked at every start.

Anything else (a bind mount of a directory, an overlay with an upper layer, a tmpfs, a
snapshot under something mounted inside the root) gets every file's sha256, as before: the test
is on the mount itself, read from ``/proc/self/mountinfo``, never on a path's name.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mount:
    point: str
    options: frozenset[str]  # per-mount options (ro, nosuid …)
    fstype: str
    super_options: frozenset[str]  # the filesystem's own (lowerdir=…, upperdir=…)


def _decode(text: str) -> str:
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse(text: str) -> list[Mount]:
    """The mounts of a mountinfo text (proc(5): fields, optional fields up to ``-``, then the
    filesystem type, source and super options); malformed lines are skipped."""
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        try:
            sep = fields.index("-", 6)
            fstype, super_options = fields[sep + 1], fields[sep + 3]
        except (ValueError, IndexError):
            continue
        mounts.append(
            Mount(
                point=_decode(fields[4]),
                options=frozenset(fields[5].split(",")),
                fstype=fstype,
                super_options=frozenset(o.split("=", 1)[0] for o in super_options.split(",")),
            )
        )
    return mounts


def _read() -> str:
    try:
        return MOUNTINFO.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return ""


def pulled_by_runtime(root: Path, mountinfo: str | None = None) -> str | None:
    """Why ``root``'s files need no hashing (``read-only overlay of the pulled layers``), or
    None when they do: the last mount at ``root`` is a read-only overlay with no upper
    directory, and nothing is mounted inside it."""
    where = posixpath.normpath(str(root))
    mounts = parse(_read() if mountinfo is None else mountinfo)
    at = [m for m in mounts if m.point == where]
    if not at or any(m.point.startswith(where.rstrip("/") + "/") for m in mounts):
        return None
    last = at[-1]  # the one on top is what the path shows
    if last.fstype != "overlay" or "ro" not in last.options or "upperdir" in last.super_options:
        return None
    return "a read-only overlay of the layers the runtime pulled by digest"
