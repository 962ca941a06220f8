"""What CRIU's page files of a snapshot hold: how much of them is zero pages and how well the
rest compresses. Issue 40's restore with the page cache dropped is the disk's time to read the
snapshot (Qwen3-8B, weights outside: 3.78 GB of images and 16.38 GB of weights at 2.0 GB/s,
10.63 s against the 10 s target, 2026-12-06): whether fewer bytes could come off the disk
(zero pages left out, the pages compressed) depends on these two numbers, which no run had.

Standard library only (it runs on the device's bare python, and inside the snapshot flow after
take). Every 1 MiB block is checked for zero 4 KiB pages; one block in ``--every`` is
compressed with zlib level 1 (a floor for zstd's ratio at a speed a restore could afford).

    python3 bench/snapshot_pages.py SNAPSHOT_DIR [--every 16] [--pack-probe WORK]   # JSON on stdout

``--pack-probe`` (and the flow's ``--pages-probe``) answers the question the profile raises:
read cold, do the page files arrive sooner packed (zlib level 1, 4 MiB frames, read back and
unpacked onto /dev/shm by one thread per CPU, at most 8) than as they are (one reader, as CRIU
reads them)? Nothing in the product packs pages yet.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

PAGE = 4096
BLOCK = 1 << 20
_ZERO_PAGE = bytes(PAGE)
_ZERO_BLOCK = bytes(BLOCK)
# CRIU's page files: the process memory it restores (``pages-<id>.img``); the rest of its images
# are small descriptions, and the snapshot's other files (weights, /dev/shm) are not CRIU's.
PAGES_GLOB = "pages-*.img"


def profile(paths: Iterable[Path], every: int = 16) -> dict[str, Any]:
    """Bytes, zero pages and the zlib-1 ratio of a sample (one block in ``every``) of ``paths``."""
    started = time.monotonic()
    files = total = zero = sampled = packed = blocks = 0
    packing = unpacking = 0.0
    for path in paths:
        files += 1
        with path.open("rb") as fh:
            while block := fh.read(BLOCK):
                total += len(block)
                zero += _zero_bytes(block)
                if blocks % every == 0:
                    sampled += len(block)
                    t = time.perf_counter()
                    small = zlib.compress(block, 1)
                    packing += time.perf_counter() - t
                    t = time.perf_counter()
                    zlib.decompress(small)
                    unpacking += time.perf_counter() - t
                    packed += len(small)
                blocks += 1
    ratio = round(sampled / packed, 3) if packed else None
    return {
        "files": files,
        "bytes": total,
        "zero_page_bytes": zero,
        "zero_share": round(zero / total, 4) if total else None,
        "zlib1_sampled_bytes": sampled,
        "zlib1_ratio": ratio,
        # What the disk would give up with the pages compressed at that ratio.
        "zlib1_estimate_bytes": round(total / ratio) if ratio else None,
        # One thread's rates over the sample, in uncompressed bytes: what take would spend
        # compressing, and a restore decompressing (zlib releases the GIL: threads add up).
        "zlib1_compress_gb_s": round(sampled / packing / 1e9, 3) if packing else None,
        "zlib1_decompress_gb_s": round(sampled / unpacking / 1e9, 3) if unpacking else None,
        "wall_s": round(time.monotonic() - started, 2),
    }


# The probe's frame: independent zlib streams, so that threads pack and unpack them at once.
FRAME = 4 << 20


@dataclasses.dataclass(frozen=True)
class _Frame:
    source: Path
    offset: int
    length: int


def pack_probe(
    files: Sequence[Path],
    work: Path,
    drop: Callable[[], bool],
    threads: int = 0,
    unpack_to: Path = Path("/dev/shm"),
) -> dict[str, Any]:
    """Would the pages come off a cold disk sooner packed? Each timed after ``drop`` (the page
    cache emptied): ``read_s``, the page files read as they are, in order, by one reader (as
    CRIU does); ``unpack_s``, their frames packed into ``work`` (zlib level 1, 4 MiB each, by
    ``threads``), read back and unpacked into files on ``unpack_to`` (a tmpfs, where CRIU would
    then read them at memory speed) by ``threads``. Not the product's: nothing restores from
    packed pages yet; this is the measure that decides whether it should."""
    threads = threads or min(8, len(os.sched_getaffinity(0)))
    frames = [
        _Frame(path, off, min(FRAME, size - off))
        for path in files
        for size in [path.stat().st_size]
        for off in range(0, size, FRAME)
    ]
    total = sum(f.length for f in frames)
    room = shutil.disk_usage(unpack_to).free
    if room < total + (64 << 20):
        return {
            "bytes": total,
            "skipped": f"{unpack_to} has {room} B free, the unpacked pages need {total} B",
        }
    work.mkdir(parents=True, exist_ok=True)
    packed_file = work / "pages.kbz"
    t = time.monotonic()
    with cf.ThreadPoolExecutor(threads) as pool:
        blobs = list(pool.map(_pack, frames))
    with packed_file.open("wb") as fh:
        for blob in blobs:
            fh.write(blob)
        fh.flush()
        os.fsync(fh.fileno())
    pack_s = time.monotonic() - t
    sizes = [len(b) for b in blobs]
    del blobs
    dropped = drop()
    t = time.monotonic()
    for path in files:
        with path.open("rb") as fh:
            while fh.read(BLOCK):
                pass
    read_s = time.monotonic() - t
    drop()
    out_dir = Path(tempfile.mkdtemp(prefix="kernelbake-unpack-", dir=unpack_to))
    try:
        t = time.monotonic()
        _unpack_all(packed_file, frames, sizes, out_dir, threads)
        unpack_s = time.monotonic() - t
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
        packed_file.unlink(missing_ok=True)
    return {
        "bytes": total,
        "packed_bytes": sum(sizes),
        "threads": threads,
        "page_cache_dropped": dropped,
        "pack_s": round(pack_s, 2),
        "read_s": round(read_s, 2),
        "unpack_s": round(unpack_s, 2),
    }


def _pack(frame: _Frame) -> bytes:
    with frame.source.open("rb") as fh:
        fh.seek(frame.offset)
        return zlib.compress(fh.read(frame.length), 1)


def _unpack_all(
    packed: Path, frames: Sequence[_Frame], sizes: Sequence[int], out_dir: Path, threads: int
) -> None:
    """Every frame read from ``packed`` (pread) and unpacked into its file under ``out_dir``."""
    starts = [0]
    for size in sizes[:-1]:
        starts.append(starts[-1] + size)
    outs: dict[Path, int] = {}
    src = os.open(packed, os.O_RDONLY)
    try:
        for frame in frames:
            if frame.source not in outs:
                outs[frame.source] = os.open(out_dir / frame.source.name, os.O_WRONLY | os.O_CREAT, 0o600)

        def one(i: int) -> None:
            data = zlib.decompress(os.pread(src, sizes[i], starts[i]))
            if len(data) != frames[i].length:
                raise ValueError(f"frame {i}: unpacked to {len(data)} bytes, {frames[i].length} were packed")
            os.pwrite(outs[frames[i].source], data, frames[i].offset)

        with cf.ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, range(len(frames))))
    finally:
        os.close(src)
        for fd in outs.values():
            os.close(fd)


def drop_page_cache() -> None:
    """The page cache emptied; ``OSError`` where this process may not (not root), for the
    probes that stop and say why rather than measure memory."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def drop_caches() -> bool:
    """The page cache emptied, or False where this process may not (not root)."""
    try:
        drop_page_cache()
    except OSError:
        return False
    return True


def page_files(snapshot: Path) -> list[Path]:
    return sorted(snapshot.rglob(PAGES_GLOB))


def _zero_bytes(block: bytes) -> int:
    if block == _ZERO_BLOCK[: len(block)]:
        return len(block) - len(block) % PAGE
    view = memoryview(block)
    return PAGE * sum(
        1 for off in range(0, len(block) - PAGE + 1, PAGE) if view[off : off + PAGE] == _ZERO_PAGE
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("snapshot", type=Path, help="a snapshot's directory (or any directory of CRIU images)")
    ap.add_argument("--every", type=int, default=16, help="compress one 1 MiB block in this many")
    ap.add_argument(
        "--pack-probe",
        type=Path,
        metavar="WORK",
        help="also pack the page files into WORK (on the snapshot's disk) and time reading them "
        "cold as they are against unpacking them onto /dev/shm (root: the page cache is dropped)",
    )
    a = ap.parse_args(argv)
    if not a.snapshot.is_dir() or a.every < 1:
        print(f"{a.snapshot}: not a directory, or --every below 1", file=sys.stderr)
        return 2
    files = page_files(a.snapshot)
    doc: dict[str, Any] = {"snapshot": str(a.snapshot), **profile(files, a.every)}
    if a.pack_probe:
        doc["pack_probe"] = pack_probe(files, a.pack_probe, drop_caches)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
