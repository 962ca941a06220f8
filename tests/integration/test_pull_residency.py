"""bench/pull_residency.py against a real Docker and registry: a layer pulled after the page
cache was dropped is in the page cache once the pull returns (what makes a freshly pulled
snapshot's restore the warm one)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import bench

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]

pull_residency = bench.load("pull_residency")


def test_a_pulled_layer_is_in_the_page_cache_and_the_pull_downloaded_it(
    registry: str, tmp_path: Path
) -> None:
    # Root, to drop the page cache first (CI and the device run as root).
    assert os.geteuid() == 0
    out = tmp_path / "r.json"
    assert pull_residency.main(["--gb", "0.05", "--registry", registry, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["bytes"] == 50_000_000 and doc["storage_driver"]
    # Downloaded (main exits otherwise), and most of it resident: the kernel keeps what the
    # unpack wrote unless memory runs short.
    assert doc["resident_share"] > 0.9, doc
