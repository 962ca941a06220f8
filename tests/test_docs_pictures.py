"""docs/performance.md's startup picture is what the committed bench JSON draws
(bench/plot_startup.py, run by `make docs`): current, and redrawn when the data changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support import bench

plot_startup = bench.load("plot_startup")
COMMITTED = REPO / "docs/performance/startup-phases.svg"


def test_the_startup_picture_is_current() -> None:
    assert plot_startup.main(["--check"]) == 0, (
        "docs/performance/startup-phases.svg is stale: run `make docs`"
    )


def _panel(path: Path, read: object) -> object:
    return plot_startup.Panel(title="t", sources=((path, read),))


def test_the_picture_follows_the_data_and_draws_restored_starts(tmp_path: Path) -> None:
    doc = json.loads(plot_startup.FLOOR.read_text())
    (model,) = doc["phases"]
    assert [label for label, _ in plot_startup.starts(doc)] == ["cold", "baked"]
    # A start named restored… in the same shape is drawn as a bar of its own.
    doc["phases"][model]["restored from a snapshot"] = {"imports": 1.0, plot_startup.TOTAL: 4.0}
    changed = tmp_path / "startup.json"
    changed.write_text(json.dumps(doc))
    assert plot_startup.starts(doc)[-1][0] == "restored from a snapshot"
    redrawn = plot_startup.render((_panel(changed, plot_startup.starts),))
    assert b"restored from a snapshot" in redrawn and redrawn != COMMITTED.read_bytes()


def test_the_h200_restores_are_drawn_from_the_snapshot_bench_phase_by_phase() -> None:
    path = plot_startup.SNAPSHOT_H200 / "weights-in.json"
    snap = json.loads(path.read_text())["models"]["qwen3-8b-dummy"]["snapshot"]
    ((label, phases),) = plot_startup.criu_restores("weights in")(json.loads(path.read_text()))
    assert label == "restored, weights in"
    assert phases[plot_startup.CRIU_RESTORE] == snap["restore"]["s"]
    assert phases[plot_startup.DRIVER_RESTORE] == snap["driver_restore_s"]
    assert phases[plot_startup.TOTAL] == snap["restored_health_s"]
    stacked = sum(v for k, v in phases.items() if k != plot_startup.TOTAL)
    assert stacked == pytest.approx(snap["restored_health_s"])
    committed = COMMITTED.read_text()
    for shown in ("restored, weights in", "restored, weights out*", f"{snap['restored_health_s']:.1f} s"):
        assert shown in committed, shown


@pytest.mark.parametrize("start", ["baked", "restored"])
def test_a_changed_cpu_snapshot_result_redraws_the_picture(tmp_path: Path, start: str) -> None:
    doc = json.loads(plot_startup.SNAPSHOT_CPU.read_text())
    rows = dict(plot_startup.cpu_snapshot(doc))
    assert rows[start][plot_startup.TOTAL] == doc[start]["ready_s"]
    doc[start]["ready_s"] = 1234.5
    changed = tmp_path / "snapshot_cpu.json"
    changed.write_text(json.dumps(doc))
    assert b"1234.5 s" in plot_startup.render((_panel(changed, plot_startup.cpu_snapshot),))


def test_the_h100_restores_through_serve_are_drawn_phase_by_phase() -> None:
    doc = json.loads(plot_startup.FLOW_8B_H100.read_text())
    got = doc["models"]["qwen3-8b-sleep"]
    rows = dict(plot_startup.flow_restores("Qwen3-8B")(doc))
    assert list(rows) == [
        "Qwen3-8B, baked",
        "Qwen3-8B, restored, page cache dropped",
        "Qwen3-8B, restored, page cache warm",
    ]
    assert rows["Qwen3-8B, baked"][plot_startup.TOTAL] == got["summary"]["ready_warm_s"]
    for label, run in zip(list(rows)[1:], got["snapshot"]["restores"].values(), strict=True):
        phases = rows[label]
        assert phases[plot_startup.TOTAL] == run["ready_s"]
        assert phases[plot_startup.CRIU_RESTORE] == run["phases_s"]["criu restore"]
        # The phases add up to the whole, to serve's rounding.
        assert sum(v for k, v in phases.items() if k != plot_startup.TOTAL) == pytest.approx(
            run["ready_s"], abs=0.1
        )
    committed = COMMITTED.read_text()
    for shown in (
        "Qwen3-8B, restored, page cache warm",
        "MoE, restored, page cache dropped*",
        "4.2 s",
        "16.7 s",
    ):
        assert shown in committed, shown
