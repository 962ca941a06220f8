"""bench/snapshot_cpu.py reads serve's line about the restore after the completion: on CI's two
loaded cores the restored engine answered /health and the completion before serve's own poll
said `restored snapshot`, and the log read at once held no such line (2026-12-07)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from tests.support import bench


def test_serve_s_line_about_the_restore_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot_cpu = bench.load("snapshot_cpu")
    logs = iter(
        [
            "engine up\n",
            "engine up\n",
            "engine up\nkernelbake serve: restored snapshot sha256:ab (2 processes)\n",
        ]
    )
    reads: list[list[str]] = []

    def docker(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        reads.append(argv)
        return subprocess.CompletedProcess(argv, 0, next(logs), "")

    monkeypatch.setattr(snapshot_cpu.subprocess, "run", docker)
    monkeypatch.setattr(snapshot_cpu.time, "sleep", lambda s: None)
    said = snapshot_cpu._said_about_snapshot("kb-x")
    assert said == ["kernelbake serve: restored snapshot sha256:ab (2 processes)"]
    assert reads == [["docker", "logs", "kb-x"]] * 3


def test_a_log_that_never_says_is_given_back_as_it_is_after_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot_cpu = bench.load("snapshot_cpu")
    monkeypatch.setattr(
        snapshot_cpu.subprocess,
        "run",
        lambda argv, **_: subprocess.CompletedProcess(argv, 0, "engine up\n", ""),
    )
    assert snapshot_cpu._said_about_snapshot("kb-x", wait_s=0.3) == []
