"""bench/dump_room_probe.py on this machine's CPU with the real CRIU 4.2.1: take's room check
(``take._room``) asked of a live process covers what ``criu dump`` then writes, and refuses a
real filesystem that cannot hold it. The GPU half (the driver's copy of device state) is the
same probe on the device machine: bench/results/dump-room-probe-*/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support import criu

# CRIU dumps a process of this host (not in a container) and the half-size tmpfs is mounted:
# both want root, which CI is.
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="criu dump and mount need root")


def test_the_room_check_covers_the_dump_and_refuses_a_disk_too_small(tmp_path: Path) -> None:
    prefix = criu.install(tmp_path / "criu")
    out = tmp_path / "out"
    r = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "dump_room_probe.py"), "--gib", "0.25",
            "--criu", str(prefix / "bin" / "criu"), "--images", str(tmp_path / "images"), "--out", str(out),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (run,) = json.loads((out / "dump-room-probe.json").read_text())["runs"]
    assert run["gpu"] is False
    # Covered, and not by a wide margin that would refuse dumps that fit.
    assert run["need_bytes"] >= run["written_bytes"] > 0.25 * (1 << 30)
    assert 0.9 <= run["estimate_over_written"] <= 1.1
    assert run["room_check_here"] is None
    assert "the dump of 1 process needs about" in run["room_check_half"]
    assert "take the snapshot onto a larger disk" in run["room_check_half"]
    assert not list((tmp_path / "images").iterdir())  # the probe's dump was removed after
