"""Issue 40 item 4 in CI: bench/snapshot_cpu.py on the default image the fixtures build (tiny-llama
on vLLM's CPU build, this tree's kernelbake inside) with CRIU from images/base/criu: the baked
start, ``snapshot take`` of it, a fresh container restored from the snapshot through serve's gate
that serves the baked engine's completion, and a key mismatch that falls back to the baked start.
The bench's exit code says whether that held; its JSON is asserted field by field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbake.pipeline import Built
from tests.conftest import REPO
from tests.support import criu

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]


def test_the_default_image_restores_from_its_snapshot_and_serves(vllm_image: Built, tmp_path: Path) -> None:
    assert vllm_image.pushed is not None
    prefix = criu.install(tmp_path / "criu")
    subprocess.run(["docker", "pull", "-q", vllm_image.pushed], check=True, capture_output=True, timeout=600)
    out = tmp_path / "snapshot.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench/snapshot_cpu.py"), "--image", vllm_image.pushed, "--criu", str(prefix), "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=3000,
    )  # fmt: skip
    assert out.is_file(), done.stderr[-4000:]
    doc = json.loads(out.read_text())
    assert doc["kernelbake"] == "the image's own"
    assert doc["restored"]["said"][0].startswith("kernelbake serve: restored snapshot"), doc["restored"]
    assert doc["summary"]["same_completion"] is True, (doc["baked"], doc["restored"])
    assert doc["restored"]["marked"] is False
    assert "snapshot not used: serve env" in doc["mismatch"]["said"], doc["mismatch"]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
