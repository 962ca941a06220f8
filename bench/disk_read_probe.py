"""How fast the machine's disk fills the page cache with the reader serve runs beside a restore
(``kernelbake.runtime.snapshot.readahead``), by the number of threads that read at once.

A restore whose weights stay outside the snapshot reloads them after the wake-up; with the page
cache dropped that reload read 16.4 GB in 9.98 s on the H100 (bench/results/
vllm-0.32.0-h100-snapshot-2026-12-06-sixth), most of the 14.82 s to serving. This writes
weight-sized files (random bytes, fsynced, in shard-sized files as a checkpoint has them), and
for each count of readers drops the page cache and times ``readahead.read`` over them.

    PYTHONPATH=src python3 bench/disk_read_probe.py --dir /root/diskprobe --gib 8 --will-need --out DIR

The seventh H100 run read 20.16 GB (the snapshot's images, then the weights) in about 10 s
beside a restore, 2.0 GB/s, above the 1.61 GB/s this probe had measured with 4 or 8 readers
alone: the disk takes more reads at once than that. ``--will-need`` asks, for each count,
whether handing every file to the kernel's readahead first (``POSIX_FADV_WILLNEED``) fills the
page cache faster still.

Needs root for /proc/sys/vm/drop_caches (the device machine runs as root); without it every
figure would be the page cache's, so it stops. Prints JSON; writes DIR/disk-read-probe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelbake.runtime.snapshot import readahead

# The sibling scripts, also where this file is loaded as a module (the tests), not run.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot_pages import drop_page_cache

_SHARD = 2 << 30


def write_files(where: Path, total: int, shard: int = _SHARD) -> list[Path]:
    """``total`` bytes in files of ``shard`` bytes (the last may be shorter), fsynced: bytes no
    disk can compress or skip, as weights are."""
    where.mkdir(parents=True, exist_ok=True)
    block = os.urandom(min(64 << 20, shard))
    files = []
    left, i = total, 0
    while left > 0:
        path = where / f"model-{i + 1:05d}.safetensors"
        size = min(shard, left)
        with path.open("wb") as fh:
            written = 0
            while written < size:
                written += fh.write(block[: size - written])
            fh.flush()
            os.fsync(fh.fileno())
        files.append(path)
        left -= size
        i += 1
    return files


def will_need(files: list[Path]) -> None:
    """Each file handed to the kernel's own readahead at once (``POSIX_FADV_WILLNEED``): it
    queues the reads itself, as deep as the device takes them, while the readers run."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


def measure(
    files: list[Path],
    workers: list[int],
    drop: Callable[[], None] = drop_page_cache,
    advise: Callable[[list[Path]], None] | None = None,
) -> list[dict[str, Any]]:
    """Per count of readers: the page cache dropped, then every byte of ``files`` read (after
    ``advise`` asked the kernel for all of them, where given)."""
    total = sum(p.stat().st_size for p in files)
    out = []
    for n in workers:
        drop()
        t0 = time.monotonic()
        if advise is not None:
            advise(files)
        got = readahead.read(files, total, workers=n)
        s = time.monotonic() - t0
        out.append(
            {
                "workers": n,
                "will_need": advise is not None,
                "bytes": got,
                "seconds": round(s, 3),
                "gb_per_s": round(got / s / 1e9, 3),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dir", type=Path, required=True, help="where the files go (the disk the weights are on)"
    )
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--workers", default="1,2,4,8,16,32")
    ap.add_argument(
        "--will-need",
        action="store_true",
        help="each count again with the kernel asked for every file first (POSIX_FADV_WILLNEED)",
    )
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        drop_page_cache()
    except OSError as exc:
        print(
            f"disk_read_probe: cannot drop the page cache ({exc}): the figures would be memory's",
            file=sys.stderr,
        )
        return 2
    t0 = time.monotonic()
    files = write_files(a.dir, int(a.gib * (1 << 30)))
    doc = {
        "dir": str(a.dir),
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
        "written_s": round(time.monotonic() - t0, 3),
        "default_workers": readahead.WORKERS,
        "reads": measure(files, counts := [int(w) for w in a.workers.split(",")]),
    }
    if a.will_need:
        doc["reads"] += measure(files, counts, advise=will_need)
    for p in files:
        p.unlink()
    return emit(doc, a.out / "disk-read-probe.json")


def write(doc: dict[str, Any], path: Path) -> None:
    """A probe's result written to ``path`` (its folder made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def emit(doc: dict[str, Any], path: Path) -> int:
    """A probe's result: written to ``path`` and printed as one line of JSON; exit status 0."""
    write(doc, path)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
