"""bench/nvml_release_probe.py's steps, played on CPU with a stand-in driver and a child without
torch, so that a device session spends its minutes on the GPU's answer, not on the probe's glue:
the child with the handler is asked and survives, the one without is not asked, and the device
state is always given back."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import pytest

from tests.runtime.snapshot.fakes import FakeDriver
from tests.support import bench

_CHILD = r"""
import os, sys, time
from pathlib import Path
if sys.argv[1] == "handler":
    from kernelbake.runtime import nvml
    nvml.install()
(Path(sys.argv[2]) / "ready").write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize(("mode", "asked"), [("plain", False), ("handler", True)])
def test_the_probe_checkpoints_asks_and_gives_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, asked: bool
) -> None:
    probe = bench.load("nvml_release_probe")
    monkeypatch.setattr(probe, "CHILD", _CHILD)
    # Held until asked: what NVML's files do on the GPU (a process with no handler keeps them).
    held: dict[int, list[str]] = {}

    def gpu_files(pid: int, proc: Path = Path("/proc")) -> list[str]:
        return held.setdefault(pid, ["/dev/nvidiactl"])

    def kill(pid: int, signum: int) -> None:
        os.kill(pid, signum)
        held[pid] = []

    monkeypatch.setattr(probe.tree, "gpu_files", gpu_files)
    monkeypatch.setattr(probe.take, "_release_nvml", functools.partial(probe.take._release_nvml, kill=kill))
    driver = FakeDriver()
    out = probe.one(mode, driver, None, tmp_path)
    assert "failed" not in out, out
    assert out["catches_release_signal"] is asked and out["asked"] is asked
    assert out["files_after_release"] == ([] if asked else ["/dev/nvidiactl"])
    # Checkpointed once, and the device state given back (no dump without CRIU here).
    assert len(driver.checkpointed) == 1 and driver.restored == driver.checkpointed


_FORKING_CHILD = r"""
import os, sys, time
from pathlib import Path
if os.fork() == 0:
    (Path(sys.argv[2]) / "ready").write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


def test_where_the_child_starts_the_gpu_work_the_one_it_started_is_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forked and spawned modes: the process holding the GPU is the one the child started
    (as vLLM's engine core is the API server's), so that one is checkpointed, given back and
    killed, and the child with it."""
    probe = bench.load("nvml_release_probe")
    monkeypatch.setattr(probe, "CHILD", _FORKING_CHILD)
    monkeypatch.setattr(probe.tree, "gpu_files", lambda pid, proc=Path("/proc"): ["/dev/nvidiactl"])
    driver = FakeDriver()
    out = probe.one("forked", driver, None, tmp_path)
    assert "failed" not in out, out
    assert out["gpu_in"] == "the child's child"
    grandchild = int((tmp_path / "forked/ready").read_text())
    assert driver.checkpointed == [grandchild] and driver.restored == [grandchild]
    # Killed (the grandchild, reparented, is not ours to reap: a zombie at most).
    deadline = time.monotonic() + 5
    while not _ended(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _ended(grandchild)


def _ended(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1]
    except (FileNotFoundError, IndexError):
        return True
    return state.startswith("Z")


class _RecordingCriu:
    """Says which pid it was asked to dump, and whether that one leads its session (CRIU refuses
    a root that does not); then fails, so nothing is restored."""

    def __init__(self) -> None:
        self.dumped: list[tuple[int, bool]] = []

    def dump(self, pid: int, images: Path, work: Path) -> tuple[bool, str]:
        self.dumped.append((pid, os.getsid(pid) == pid))
        log = work / "dump.log"
        log.write_text("(00.1) Error (criu/cr-dump.c:1): recorded, not dumped\n")
        return False, str(log)


def test_the_tree_is_dumped_from_its_root_which_leads_its_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spawned mode's first device run (2026-12-06) dumped the GPU process, a grandchild:
    CRIU refused it ("not a session leader"). The root the probe started is dumped, the tree
    with it, while the grandchild is the one checkpointed."""
    probe = bench.load("nvml_release_probe")
    monkeypatch.setattr(probe, "CHILD", _FORKING_CHILD)
    monkeypatch.setattr(probe.tree, "gpu_files", lambda pid, proc=Path("/proc"): [])
    driver, criu = FakeDriver(), _RecordingCriu()
    out = probe.one("spawned", driver, criu, tmp_path)
    grandchild = int((tmp_path / "spawned/ready").read_text())
    assert driver.checkpointed == [grandchild]
    assert len(criu.dumped) == 1
    root, leads = criu.dumped[0]
    assert root != grandchild and leads
    assert out["failed"].startswith("criu dump:")
