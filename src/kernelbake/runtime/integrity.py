"""Every cache file checked against the manifest before an engine may open it.

Sizes are compared at once (a ``stat`` per file). The sha256 of every file is computed in a
thread pool that starts as soon as the manifest is read, so it runs while the preflight
imports the engine's libraries and, under ``serve``, while the engine itself starts
(``runtime.gate`` holds the engine until the verdict is in). ``hashlib`` releases the GIL
while it hashes and the reads release it too, so the threads really run beside an import.

Files are opened beneath the cache root one path part at a time, none of them followed if it
is a symlink, so a manifest entry or a planted link cannot make the runtime read (or name the
digest of) a file elsewhere. A file or link in the cache root that the manifest does not list
is a problem too: an engine looks its entries up by name and would load it unverified.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import hashlib
import os
import stat
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

from kernelbake.contract.layout import MANIFEST
from kernelbake.contract.manifest import FileEntry, Manifest, bundle_path_problem

# Reads from a freshly pulled overlay filesystem wait on the disk; a few threads per core
# keep it busy without starving the engine's import of the remaining cores.
_MAX_WORKERS = 8


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class NotPlain(OSError):
    """A path part is a symlink, or the file is not a regular file."""


@contextlib.contextmanager
def open_beneath(root: Path, rel: str) -> Iterator[int]:
    """A read-only descriptor of the regular file ``rel`` under ``root``, reached without
    following a symlink at any part of ``rel`` (``root`` itself may be one: /opt/... in an
    image is the administrator's, not the bundle's)."""
    if problem := bundle_path_problem(rel):
        raise NotPlain(errno.EINVAL, f"the path {problem}")
    *dirs, name = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in dirs:
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotPlain(exc.errno, f"{part} is a symlink or not a directory") from None
                raise
            os.close(fd)
            fd = nxt
        try:
            # O_NONBLOCK: a FIFO planted at the path must not hang the start.
            out = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotPlain(exc.errno, "a symlink") from None
            raise
    finally:
        os.close(fd)
    try:
        if not stat.S_ISREG(os.fstat(out).st_mode):
            raise NotPlain(errno.EINVAL, "not a regular file")
        yield out
    finally:
        os.close(out)


def read_file(root: Path, rel: str) -> bytes:
    with open_beneath(root, rel) as fd, os.fdopen(os.dup(fd), "rb") as fh:
        return fh.read()


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _size_problem(root: Path, entry: FileEntry, record: str) -> str | None:
    """What is wrong with ``entry``'s file under ``root`` before its bytes are read: not there,
    not a plain file reached without a symlink, unreadable, or another size than ``record``
    (the manifest or the delta) says."""
    try:
        with open_beneath(root, entry.path) as fd:
            size = os.fstat(fd).st_size
    except NotPlain as exc:
        return f"{entry.path}: not a plain file of the {'cache root' if record == 'manifest' else record} ({_why(exc)})"
    except FileNotFoundError:
        return f"{entry.path}: missing"
    except OSError as exc:
        return f"{entry.path}: cannot be read ({_why(exc)})"
    if size != entry.size:
        return f"{entry.path}: size {size} but the {record} records {entry.size}"
    return None


def size_problems(root: Path, manifest: Manifest) -> list[str]:
    return [p for f in manifest.files if (p := _size_problem(root, f, "manifest")) is not None]


def strangers(root: Path, manifest: Manifest, delta: Collection[str] = ()) -> list[str]:
    """Everything in the cache root the manifest does not account for: symlinks anywhere,
    and files that are neither listed, the manifest itself, nor one of the engine's logs.
    ``delta``: the paths of the pinned cache delta, which a restart finds merged already;
    their bytes are the delta's to judge (``runtime.serve.delta.apply``), and where it is not used
    the preflight counts them as strangers after all."""
    listed = {f.path for f in manifest.files} | set(delta)  # ``size_problems`` judges these
    unhashed = {*manifest.logs, MANIFEST}
    found = []
    for p, rel, dirs in walk_sorted(root):
        link = p.is_symlink()
        if rel in listed or (rel in unhashed and not link) or (p.name in dirs and not link):
            continue
        found.append(f"{rel}: a {'symlink' if link else 'file'} the manifest does not list")
    return found


def walk_sorted(root: Path) -> Iterator[tuple[Path, str, list[str]]]:
    """Every entry under ``root``, top down, each directory's entries (directories and files
    together) in sorted order: its path, that path relative to ``root`` as POSIX, and the
    directory's subdirectories as ``os.walk`` lists them (not followed through a symlink;
    remove a name there before the next entry to leave that directory out)."""
    for dirpath, dirs, files in os.walk(root):
        base = Path(dirpath)
        for name in sorted([*dirs, *files]):
            p = base / name
            yield p, p.relative_to(root).as_posix(), dirs


def _digest_problem(root: Path, entry: FileEntry, record: str = "manifest") -> str | None:
    try:
        with open_beneath(root, entry.path) as fd, os.fdopen(os.dup(fd), "rb") as fh:
            found = hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError as exc:
        return f"{entry.path}: cannot be read ({_why(exc)})"
    if found != entry.sha256:
        return f"{entry.path}: sha256 {found} but the {record} records {entry.sha256}"
    return None


def file_problems(root: Path, entries: Iterable[FileEntry]) -> list[str]:
    """Size, then sha256, of each of ``entries`` under ``root`` (never through a symlink):
    for files that are not a bundle of their own (a cache delta's), so there are no strangers
    to look for. Empty when every file is what its entry says."""
    problems = []
    for entry in entries:
        problem = _size_problem(root, entry, "delta") or _digest_problem(root, entry, "delta")
        if problem is not None:
            problems.append(problem)
    return problems


class Check:
    """One verification of a bundle; ``result()`` waits for it and lists what differs."""

    def __init__(
        self, root: Path, manifest: Manifest, *, hash_files: bool, delta: Collection[str] = ()
    ) -> None:
        self.files = len(manifest.files)
        self.hashed = hash_files
        self.started = time.monotonic()
        self._finished: float | None = None
        self._problems = size_problems(root, manifest) + strangers(root, manifest, delta)
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
