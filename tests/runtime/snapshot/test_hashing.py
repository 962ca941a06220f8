"""The snapshot's files hashed several at once: every digest right, the largest started first,
an unreadable file named rather than raised, and a loop left early hashes nothing more."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from pathlib import Path

import pytest

from kernelbake.runtime.snapshot import hashing


def _files(tmp_path: Path, sizes: list[int]) -> list[Path]:
    paths = []
    for i, size in enumerate(sizes):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(size))
        paths.append(p)
    return paths


def _recorded(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files hashing starts on, in the order it starts them (no hashing done)."""
    started: list[Path] = []
    lock = threading.Lock()

    def record(path: Path) -> str:
        with lock:
            started.append(path)
        return "x"

    monkeypatch.setattr(hashing, "file_sha256", record)
    return started


def test_every_file_comes_back_once_with_its_own_sha256(tmp_path: Path) -> None:
    paths = _files(tmp_path, [1, 4096, 300_000, 0, 70_000, 5])
    got = dict(hashing.sha256s(paths, threads=3))
    assert got == {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def test_the_largest_files_are_started_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _files(tmp_path, [10, 3000, 200, 50_000, 7])
    started = _recorded(monkeypatch)
    list(hashing.sha256s(paths, threads=1))
    assert started == sorted(paths, key=lambda p: p.stat().st_size, reverse=True)


def test_a_file_that_cannot_be_read_is_answered_with_its_error(tmp_path: Path) -> None:
    paths = _files(tmp_path, [10, 20])
    gone = tmp_path / "gone"
    got = dict(hashing.sha256s([*paths, gone], threads=2))
    assert isinstance(got[gone], FileNotFoundError)
    assert got[paths[0]] == hashlib.sha256(paths[0].read_bytes()).hexdigest()


def test_closing_early_cancels_the_files_not_begun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = _files(tmp_path, list(range(100, 120)))
    hashed = _recorded(monkeypatch)
    with contextlib.closing(hashing.sha256s(paths, threads=1)) as results:
        next(results)
    # One thread: the first file, perhaps the one it had begun next, and none after.
    assert 1 <= len(hashed) <= 2 < len(paths)


def test_threads_are_the_cpus_this_process_may_use_and_no_more_than_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(3)))
    assert hashing.workers() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)))
    assert hashing.workers() == hashing.MAX_WORKERS
