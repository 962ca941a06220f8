"""What CRIU's page files of a snapshot hold: how much of them is zero pages and how well the
rest compresses. Issue 40's restore with the page cache dropped is the disk's time to read the
snapshot (Qwen3-8B, weights outside: 3.78 GB of images and 16.38 GB of weights at 2.0 GB/s,
10.63 s against the 10 s target, 2026-12-06): whether fewer bytes could come off the disk
(zero pages left out, the pages compressed) depends on these two numbers, which no run had.

Standard library only (it runs on the device's bare python, and inside the snapshot flow after
take). Every 1 MiB block is checked for zero 4 KiB pages; one block in ``--every`` is
compressed with zlib level 1 (a floor for zstd's ratio at a speed a restore could afford).

    python3 bench/snapshot_pages.py SNAPSHOT_DIR [--every 16]      # JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from collections.abc import Iterable
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
    a = ap.parse_args(argv)
    if not a.snapshot.is_dir() or a.every < 1:
        print(f"{a.snapshot}: not a directory, or --every below 1", file=sys.stderr)
        return 2
    doc = {"snapshot": str(a.snapshot), **profile(page_files(a.snapshot), a.every)}
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
