"""Every cache file checked against the manifest before an engine may open it.

Sizes are compared at once (a ``stat`` per file). The sha256 of every file is computed in a
thread pool that starts as soon as the manifest is read, so it runs while the preflight
imports the engine's libraries and, under ``serve``, while the engine itself starts
(``runtime.gate`` holds the engine until the verdict is in). ``hashlib`` releases the GIL
while it hashes and the reads release it too, so the threads really run beside an import.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import time
from pathlib import Path

from kernelbake.contract.manifest import FileEntry, Manifest

# Reads from a freshly pulled overlay filesystem wait on the disk; a few threads per core
# keep it busy without starving the engine's import of the remaining cores.
_MAX_WORKERS = 8


def size_problems(root: Path, manifest: Manifest) -> list[str]:
    problems = []
    for f in manifest.files:
        p = root / f.path
        try:
            size = p.stat().st_size if p.is_file() and not p.is_symlink() else None
        except OSError:
            size = None
        if size is None:
            problems.append(f"{f.path}: missing")
        elif size != f.size:
            problems.append(f"{f.path}: size {size} but the manifest records {f.size}")
    return problems


def _digest_problem(root: Path, entry: FileEntry) -> str | None:
    try:
        with (root / entry.path).open("rb") as fh:
            found = hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        return f"{entry.path}: cannot be read ({exc.strerror})"
    if found != entry.sha256:
        return f"{entry.path}: sha256 {found} but the manifest records {entry.sha256}"
    return None


class Check:
    """One verification of a bundle; ``result()`` waits for it and lists what differs."""

    def __init__(self, root: Path, manifest: Manifest, *, hash_files: bool) -> None:
        self.files = len(manifest.files)
        self.hashed = hash_files
        self.started = time.monotonic()
        self._finished: float | None = None
        self._problems = size_problems(root, manifest)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._futures: list[concurrent.futures.Future[str | None]] = []
        if hash_files and not self._problems and manifest.files:
            workers = max(1, min(_MAX_WORKERS, (os.cpu_count() or 1) * 2, len(manifest.files)))
            self._pool = concurrent.futures.ThreadPoolExecutor(
                workers, thread_name_prefix="kernelbake-sha256"
            )
            self._futures = [self._pool.submit(self._hash, root, f) for f in manifest.files]
            self._pool.shutdown(wait=False)
        else:
            self._finished = time.monotonic()

    def _hash(self, root: Path, entry: FileEntry) -> str | None:
        problem = _digest_problem(root, entry)
        # Timed to the last file hashed, not to whoever asks for the result later; set
        # before the future completes, so ``result()`` always sees it.
        self._finished = time.monotonic()
        return problem

    def done(self) -> bool:
        return all(f.done() for f in self._futures)

    def result(self) -> list[str]:
        found = [p for p in (f.result() for f in self._futures) if p is not None]
        return self._problems + found

    def cancel(self) -> None:
        """The caches will not be used anyway (another reason to start cold)."""
        for f in self._futures:
            f.cancel()

    @property
    def seconds(self) -> float:
        """From the start to the last file checked (so far, while still running)."""
        last = self._finished if self._finished is not None and self.done() else time.monotonic()
        return last - self.started

    def summary(self) -> str:
        how = "sha256 of every file" if self.hashed else "sizes only (UNSAFE)"
        return f"{self.files} files, {how} checked in {self.seconds:.2f} s"


def verify(root: Path, manifest: Manifest, *, hash_files: bool = True) -> list[str]:
    """What differs from the manifest, waiting for the hashes (empty when intact)."""
    return Check(root, manifest, hash_files=hash_files).result()
