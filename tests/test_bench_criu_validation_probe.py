"""bench/criu_validation_probe.py: its summary over restores whose numbers are known, and the
probe itself with the real CRIU in a privileged container (a python that imported torch dumped
once, restored each way with the page cache dropped and other files read beside)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support import bench, criu
from tests.support.docker import CPU_BASE, require_cpu_base

probe = bench.load("criu_validation_probe")


def _row(mode: str, wall: float, mappings: float, pages: float, ok: bool = True) -> dict[str, object]:
    by_work = {
        "opening file mappings": {"lines": 3, "waited_s": mappings},
        "reading pages": {"lines": 1, "waited_s": pages},
    }
    return {"mode": mode, "ok": ok, "restore_s": wall, "by_work": by_work}


def test_the_summary_takes_medians_per_way_over_the_restores_that_succeeded() -> None:
    rows = [
        _row("buildid", 3.0, 1.0, 0.5),
        _row("filesize", 1.0, 0.2, 0.3),
        _row("filesize", 2.0, 0.4, 0.9),
        _row("buildid", 1.0, 0.3, 0.1),
        _row("buildid", 2.0, 0.5, 0.2),
        _row("filesize", 9.0, 9.0, 9.0, ok=False),
    ]
    assert probe.summary(rows) == {
        "buildid": {
            "restores": 3,
            "restore_s_median": 2.0,
            "mappings_waited_s_median": 0.5,
            "pages_waited_s_median": 0.2,
            "mapping_opens": 3,
        },
        "filesize": {
            "restores": 2,
            "restore_s_median": 1.5,
            "mappings_waited_s_median": 0.3,
            "pages_waited_s_median": 0.6,
            "mapping_opens": 3,
        },
    }
    assert probe.summary([_row("buildid", 1.0, 0.1, 0.1, ok=False)])["filesize"] == {"restores": 0}


@pytest.mark.docker
def test_the_probe_dumps_once_and_restores_each_way_with_the_real_criu(tmp_path: Path) -> None:
    require_cpu_base()
    prefix = criu.install(tmp_path / "criu")
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run(
        ["docker", "run", "--rm", "--init", "--privileged", "--network", "none",
         "-v", f"{REPO}:/kb:ro", "-v", f"{out}:/out", "-v", f"{prefix}:/opt/kernelbake-criu:ro", CPU_BASE,
         "python3", "/kb/bench/criu_validation_probe.py", "--criu", "/opt/kernelbake-criu/bin/criu",
         "--work", "/tmp/probe", "--rounds", "2", "--contend-gb", "0.2", "--out", "/out/probe.json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((out / "probe.json").read_text())
    # Four restores, the second round in the other order; each killed after it.
    assert [r["mode"] for r in doc["restores"]] == ["buildid", "filesize", "filesize", "buildid"]
    assert all(r["ok"] and r["killed"] and r["page_cache_dropped"] for r in doc["restores"]), doc["restores"]
    for mode in ("buildid", "filesize"):
        row = doc["summary"][mode]
        # torch's libraries are mapped: the log names their opening, and CRIU read the pages.
        assert row["restores"] == 2 and row["mapping_opens"] > 50, row
        assert row["restore_s_median"] > 0
