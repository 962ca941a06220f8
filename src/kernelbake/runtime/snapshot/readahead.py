"""The snapshot's images and the model's weight files read into the page cache while CRIU
restores a snapshot taken with its weights outside, so that CRIU and then vLLM's reload after
the wake-up read memory, not the disk.

Measured on the H100 (2026-12-06, Qwen3-8B, vLLM 0.32, page cache dropped): the snapshot was
back in 4.7 s, then the reload read 16.4 GB in 9.98 s, 14.82 s to serving; with the files read
beside the restore by one reader, 13.19 s (both read the same disk). Several readers at once
keep more of a fast disk busy. Bounded: ``WORKERS`` daemon threads, at most half the memory
available (to the container, where it has a limit), and only the files the checkpoint's index
names (a directory may also hold another copy of the weights)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from kernelbake.runtime.snapshot.machine import cgroup_memory, mem_available

# The index of a sharded safetensors checkpoint (Hugging Face's layout): which file holds
# each tensor. Without one, every *.safetensors file is read.
INDEX = "model.safetensors.index.json"
_CHUNK = 16 << 20
# A worker's unit: small enough that the pieces the reload reads first are read first, large
# enough that each is a few hundred sequential reads.
_RANGE = 256 << 20
# Threads that read at once: one reader's 16 MiB reads leave a fast disk idle between them
# (bench/disk_read_probe.py measures the device's disk with 1 to 8).
WORKERS = 4


def weight_files(model: Path) -> list[Path]:
    """The files vLLM's safetensors loader reads from ``model``, by name; none where it has none."""
    try:
        names = set(json.loads((model / INDEX).read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return sorted(p for p in model.glob("*.safetensors") if p.is_file())
    return sorted(p for name in names if (p := model / str(name)).is_file() and p.parent == model)


def available_bytes(meminfo: Path = Path("/proc/meminfo"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """What memory is left for the page cache: the kernel's ``MemAvailable`` (bytes), and in a
    container with a memory limit no more than what the limit leaves, since the page cache a
    container reads is charged to it (/proc/meminfo shows the node's), and the cache it already
    holds is not room for more. 0 where ``MemAvailable`` cannot be read: then nothing is read
    ahead."""
    if (node := mem_available(meminfo)) is None:
        return 0
    if (limited := cgroup_memory(cgroup)) is None:
        return node
    return max(0, min(node, limited.limit - limited.used))


class ReadAhead:
    """The reading, on its thread: how far it got, for serve's line (``said``)."""

    def __init__(self, files: list[Path], budget: int, workers: int = WORKERS, images: int = 0) -> None:
        self.files = tuple(files)
        self.budget = budget
        self.workers = workers
        # How many of ``files``, at their head, are the snapshot's own images.
        self.images = images
        self.done = 0
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="kernelbake-readahead", daemon=True)

    def _run(self) -> None:
        read(self.files, self.budget, self, self.workers)

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n

    def said(self) -> str:
        going = ", still reading" if self.thread.is_alive() else ""
        images, weights = (
            _count(self.images, "image file"),
            _count(len(self.files) - self.images, "weight file"),
        )
        return f"{self.done} B read ahead beside it (the snapshot's {images}, then {weights}{going})"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def ranges(files: tuple[Path, ...] | list[Path], budget: int) -> list[tuple[Path, int, int]]:
    """The pieces to read, ``(file, offset, length)``, in the order the reload reads them (file
    by file, front to back) and no more than ``budget`` bytes in all. A file whose size cannot
    be read is passed over: the reload reads it itself and says what is wrong with it."""
    out: list[tuple[Path, int, int]] = []
    left = budget
    for path in files:
        try:
            size = path.stat().st_size
        except OSError:
            continue
        offset = 0
        while left > 0 and offset < size:
            n = min(_RANGE, size - offset, left)
            out.append((path, offset, n))
            offset += n
            left -= n
    return out


def read(
    files: tuple[Path, ...] | list[Path],
    budget: int,
    progress: ReadAhead | None = None,
    workers: int = WORKERS,
) -> int:
    """``files`` read until ``budget`` bytes, by ``workers`` threads taking the pieces of
    ``ranges`` in order; the bytes read (also added to ``progress`` as they come)."""
    todo = iter(ranges(files, budget))
    lock = threading.Lock()
    # Each thread's own count, added up once all have ended.
    counts: list[int] = []

    def work() -> None:
        # One buffer per thread: the bytes are wanted in the page cache, not here.
        buf = memoryview(bytearray(_CHUNK))
        got = 0
        while True:
            with lock:
                piece = next(todo, None)
            if piece is None:
                break
            got += _read_range(*piece, buf, progress)
        counts.append(got)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(max(1, workers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts)


def _read_range(path: Path, offset: int, length: int, buf: memoryview, progress: ReadAhead | None) -> int:
    got_all = 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        while got_all < length:
            got = os.preadv(fd, [buf[: min(_CHUNK, length - got_all)]], offset + got_all)
            if got <= 0:
                break
            got_all += got
            if progress is not None:
                progress.add(got)
    except OSError:
        pass
    finally:
        os.close(fd)
    return got_all


def start(model: Path | None, limit: int | None = None, images: Sequence[Path] = ()) -> ReadAhead | None:
    """The reading of the snapshot's ``images`` and then ``model``'s weight files (none without
    a model: a snapshot whose weights are among its own files), started, up to ``limit`` bytes
    (half of what is available by default: pages read beyond memory would push out the first
    ones before they are used); None where there is nothing to read.

    The images come first: ``criu restore`` reads them at once, and behind 31 GB of weights it
    waited for the disk (the FP8 MoE on the H100, 2026-12-06: 20.86 s with the page cache
    dropped, 1.61 s without); the reload reads the weights only after it."""
    files = [*images, *(weight_files(model) if model is not None else [])]
    budget = available_bytes() // 2 if limit is None else limit
    if not files or budget <= 0:
        return None
    ahead = ReadAhead(files, budget, images=len(images))
    ahead.thread.start()
    return ahead
