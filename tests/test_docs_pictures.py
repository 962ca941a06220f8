"""docs/performance.md's startup picture is what the committed bench JSON draws
(bench/plot_startup.py, run by `make docs`): current, and redrawn when the data changes."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import REPO
from tests.support import bench

plot_startup = bench.load("plot_startup")


def test_the_startup_picture_is_current() -> None:
    assert plot_startup.main(["--check"]) == 0, (
        "docs/performance/startup-phases.svg is stale: run `make docs`"
    )


def test_the_picture_follows_the_data_and_draws_restored_starts(tmp_path: Path) -> None:
    (source,) = plot_startup.SOURCES
    doc = json.loads(source.read_text())
    (model,) = doc["phases"]
    assert [label for label, _ in plot_startup.starts(doc)] == [f"{model}, cold", f"{model}, baked"]
    # A snapshot result in the same shape is drawn as a third bar, and the picture changes.
    doc["phases"][model]["restored from a snapshot"] = {"imports": 1.0, plot_startup.TOTAL: 4.0}
    changed = tmp_path / "startup.json"
    changed.write_text(json.dumps(doc))
    assert plot_startup.starts(doc)[-1][0] == f"{model}, restored from a snapshot"
    redrawn = plot_startup.render((changed,))
    assert redrawn != (REPO / "docs/performance/startup-phases.svg").read_bytes()
    assert b"restored from a snapshot" in redrawn
