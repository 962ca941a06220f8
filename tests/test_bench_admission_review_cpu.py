"""bench/admission_review_cpu.py runs the load mix through this tree's admitter in process: every
review of it is allowed (the bench asserts so), and what it prints is one JSON line of counts."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO
from tests.support import bench

BENCH = bench.load("admission_review_cpu")


def test_the_mix_is_reviewed_in_process_and_counted() -> None:
    run = BENCH._mix(REPO)
    run(8)  # raises if any review of the mix is not allowed


def test_it_prints_one_json_line_of_counts() -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "admission_review_cpu.py"), "--reviews", "40"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = json.loads(out)
    assert result["reviews"] == 40
    # The mix makes a few hundred Python calls a review (374 at d6fcc27); a count far off means
    # the bench stopped reviewing (an answer from a cache, an early refusal).
    assert 200 < result["calls_per_review"] < 1000
    assert result["us_per_review"] > 0
