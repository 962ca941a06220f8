"""bench/snapshot_pages.py: the zero pages and the compressibility of a snapshot's CRIU page
files, counted on files whose contents are known."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import bench

snapshot_pages = bench.load("snapshot_pages")
PAGE, BLOCK = 4096, 1 << 20


def _snapshot(root: Path) -> Path:
    images = root / "images"
    images.mkdir(parents=True)
    # Block 1: all zero; block 2: 3 zero pages then random; block 3: a half block of text.
    random = os.urandom(BLOCK - 3 * PAGE)
    (images / "pages-1.img").write_bytes(bytes(BLOCK) + bytes(3 * PAGE) + random)
    (images / "pages-2.img").write_bytes(b"kernelbake " * (BLOCK // 22))
    # Not CRIU's page files: left out.
    (images / "mm-7.img").write_bytes(bytes(BLOCK))
    (images / "weights").mkdir()
    (images / "weights" / "rank-0.bin").write_bytes(bytes(BLOCK))
    return root


def test_zero_pages_and_the_sampled_ratio_are_counted_in_the_page_files_alone(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path / "snap")
    doc = snapshot_pages.profile(snapshot_pages.page_files(snap), every=1)
    text = BLOCK // 22 * 11
    assert doc["files"] == 2 and doc["bytes"] == 2 * BLOCK + text
    # The whole zero block, the three zero pages; the text has none, nor has the random rest.
    assert doc["zero_page_bytes"] == BLOCK + 3 * PAGE
    # Zeros and text compress, random bytes do not: the ratio lies between.
    assert 1.5 < doc["zlib1_ratio"] < 4, doc
    assert doc["zlib1_estimate_bytes"] == round(doc["bytes"] / doc["zlib1_ratio"])
    assert doc["zlib1_compress_gb_s"] > 0 and doc["zlib1_decompress_gb_s"] > 0


def test_sampling_compresses_one_block_in_every(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path / "snap")
    # Blocks in order: zero block, zero pages + random, the text: every 2nd is the 1st and 3rd.
    doc = snapshot_pages.profile(snapshot_pages.page_files(snap), every=2)
    assert doc["zlib1_sampled_bytes"] == BLOCK + BLOCK // 22 * 11


def test_the_command_prints_json_and_refuses_what_is_not_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = _snapshot(tmp_path / "snap")
    assert snapshot_pages.main([str(snap), "--every", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == 2
    assert snapshot_pages.main([str(tmp_path / "none")]) == 2
