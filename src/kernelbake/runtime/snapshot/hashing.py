"""The sha256 of a snapshot's files, several at once: take records them, and serve's gate checks
them wherever the snapshot is no image volume the runtime pulled by digest.

One thread was enough while one process's pages were most of a snapshot's bytes (the CPU image:
two threads no faster on two cores, bench/results/snapshot_verify.json). With the weights kept
beside the snapshot they are not: the FP8 MoE's 34.8 GB are 30 weight files of about 1 GB and a
2.7 GB page file, and one thread hashed them in 32.5 s at take and again in 33.6 s at each start
that had to hash them (H100 host, 16 cores, 2026-12-07), longer than the baked start it would
replace. hashlib lets go of the GIL while it hashes a buffer, so threads scale with the cores:
34.8 GB of that shape on the same host took 33.51 s on one thread and 4.82 s on eight
(bench/results/snapshot_verify-beside-h100.json)."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Generator, Sequence
from pathlib import Path

from kernelbake.runtime.bundle import file_sha256

# More threads than this gain nothing once the page cache or the disk, not the cores, is the limit.
MAX_WORKERS = 8


def workers() -> int:
    """Threads to hash with: the CPUs this process may run on (a cpuset, not the node's count),
    at most ``MAX_WORKERS``."""
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def sha256s(
    paths: Sequence[Path], *, threads: int | None = None
) -> Generator[tuple[Path, str | OSError], None, None]:
    """Each of ``paths`` with its sha256 (hex), or the error that kept it from being read, as
    each is done. The largest start first, so the longest is not left for last. Closing the
    generator early (``contextlib.closing`` around a loop that returns) cancels the files not
    begun and waits only for those being hashed."""
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=threads or workers(), thread_name_prefix="kernelbake-sha256"
    )
    try:
        futures = {pool.submit(file_sha256, p): p for p in sorted(paths, key=_size, reverse=True)}
        for done in concurrent.futures.as_completed(futures):
            try:
                yield futures[done], done.result()
            except OSError as exc:
                yield futures[done], exc
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
