"""A tar layer of files on disk, made as it is read and never written anywhere.

A snapshot is as large as its model (2.2 GB for the tiny CPU model, tens of GB with an MoE's
weights beside it), and a layer written to a temporary file first needs that much free disk a
second time: ``make snapshot`` failed with ENOSPC on a CI machine that held the snapshot itself
(2026-12-06). The tar is a pure function of the files' names, sizes and bytes (root-owned,
mtime 0, in the order given), so its digest is taken in one pass over the files and the same
bytes are made again while they are uploaded; a file that changed in between is caught twice,
here by its recorded sha256 and by the registry, which checks the digest on commit.

The bytes are those ``tarfile`` writes for ``referrer.add_file`` (both take their entries from
``entries``: PAX format, each directory above a file once before it; the end-of-archive blocks
padded to a record); the tests compare the two.
"""

from __future__ import annotations

import dataclasses
import hashlib
import tarfile
from collections.abc import Iterator
from pathlib import Path

from kernelbake.errors import BadInput
from kernelbake.oci import Descriptor
from kernelbake.oci import types as mt

_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
# What one read of a file asks for.
_READ = 8 << 20


@dataclasses.dataclass(frozen=True)
class Member:
    """One file of the layer: its path in the tar, and what it must be on disk."""

    path: str
    size: int
    sha256: str  # hex


def entries(path: str, size: int, mode: int, mtime: int, seen: set[str]) -> Iterator[tarfile.TarInfo]:
    """The tar entries of ``path``, owned by root: each directory above it not in ``seen`` yet
    (added to it), mode 0755 and mtime 0, then the file itself. The one layout every kernelbake
    tar has, written by ``tarfile`` (``referrer.add_file``) or made here as it is read."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        if (d := "/".join(parts[:i])) not in seen:
            seen.add(d)
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            yield info
    info = tarfile.TarInfo(path)
    info.size, info.mode, info.mtime = size, mode, mtime
    yield info


def _pad(n: int, unit: int) -> int:
    return -n % unit


@dataclasses.dataclass(frozen=True)
class FileTar:
    """The tar of ``members`` (read from under ``root``), each file with ``mode``."""

    root: Path
    members: tuple[Member, ...]
    mode: int = 0o444

    def _headers(self) -> Iterator[tuple[bytes, Member | None]]:
        seen: set[str] = set()
        for m in self.members:
            for info in entries(m.path, m.size, self.mode, 0, seen):
                header = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
                yield header, (m if info.isfile() else None)

    def size(self) -> int:
        """The tar's length, from the names and sizes alone."""
        n = sum(len(h) + (m.size + _pad(m.size, _BLOCK) if m else 0) for h, m in self._headers())
        n += 2 * _BLOCK
        return n + _pad(n, _RECORD)

    def chunks(self) -> Iterator[bytes]:
        """The tar's bytes, in pieces; a file whose size or sha256 is not its member's stops it
        (``BadInput``: the snapshot changed after it was checked)."""
        written = 0
        for header, m in self._headers():
            yield header
            written += len(header)
            if m is None:
                continue
            yield from self._file(m)
            written += m.size
            if pad := _pad(m.size, _BLOCK):
                yield b"\0" * pad
                written += pad
        end = 2 * _BLOCK
        yield b"\0" * (end + _pad(written + end, _RECORD))

    def _file(self, m: Member) -> Iterator[bytes]:
        path = self.root / m.path
        got, h = 0, hashlib.sha256()
        with path.open("rb") as fh:
            while piece := fh.read(min(_READ, m.size - got + 1)):
                got += len(piece)
                if got > m.size:
                    break
                h.update(piece)
                yield piece
        if got != m.size or h.hexdigest() != m.sha256:
            read = f"{got} B" if got <= m.size else f"over {m.size} B"
            raise BadInput(
                f"{path}: sha256 {h.hexdigest()} ({read} read), recorded {m.sha256} ({m.size} B); "
                "it changed after it was recorded: push a snapshot only once take has finished with it"
            )

    def descriptor(self) -> Descriptor:
        """The layer's descriptor: one pass over every file, each checked against its member."""
        h, n = hashlib.sha256(), 0
        for piece in self.chunks():
            h.update(piece)
            n += len(piece)
        return Descriptor(media_type=mt.OCI_LAYER_TAR, digest="sha256:" + h.hexdigest(), size=n)

    def reader(self) -> Reader:
        return Reader(self.chunks(), self.size())


class Reader:
    """The tar as a file to read from, with a length (what an HTTP client streams a request's
    body from, with its ``Content-Length``). Reads of a few KiB from pieces of 8 MiB: each
    read slices the current piece, never copies what is left of it."""

    def __init__(self, chunks: Iterator[bytes], size: int) -> None:
        self._chunks = chunks
        self._size = size
        self._piece = memoryview(b"")
        self._at = 0

    def __len__(self) -> int:
        return self._size

    def read(self, n: int = -1) -> bytes:
        out: list[bytes] = []
        want = n
        while want != 0:
            if self._at == len(self._piece):
                piece = next(self._chunks, None)
                if piece is None:
                    break
                self._piece, self._at = memoryview(piece), 0
            take = len(self._piece) - self._at if want < 0 else min(want, len(self._piece) - self._at)
            out.append(bytes(self._piece[self._at : self._at + take]))
            self._at += take
            if want > 0:
                want -= take
        return b"".join(out)
