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


def test_the_pack_probe_reads_both_ways_after_a_drop_each_and_unpacks_every_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snapshot(tmp_path / "snap")
    files = snapshot_pages.page_files(snap)
    shm = tmp_path / "shm"
    shm.mkdir()
    unpacked: dict[str, bytes] = {}
    real = snapshot_pages._unpack_all

    def keep(packed: Path, frames: object, sizes: object, out_dir: Path, threads: int) -> None:
        real(packed, frames, sizes, out_dir, threads)
        unpacked.update({p.name: p.read_bytes() for p in out_dir.iterdir()})

    monkeypatch.setattr(snapshot_pages, "_unpack_all", keep)
    # Frames smaller than a file, so that one file is unpacked from several, out of order.
    monkeypatch.setattr(snapshot_pages, "FRAME", 256 << 10)
    drops: list[int] = []
    doc = snapshot_pages.pack_probe(files, tmp_path / "work", lambda: drops.append(1) is None, 3, shm)
    assert drops == [1, 1] and doc["page_cache_dropped"] is True
    assert unpacked == {p.name: p.read_bytes() for p in files}
    assert doc["bytes"] == sum(p.stat().st_size for p in files) and 0 < doc["packed_bytes"] < doc["bytes"]
    assert doc["threads"] == 3 and doc["read_s"] >= 0 and doc["unpack_s"] >= 0
    # Nothing is left: not the packed file, not the unpacked copies on the tmpfs.
    assert not list((tmp_path / "work").iterdir()) and not list(shm.iterdir())


def test_a_frame_that_unpacks_to_another_length_is_an_error_not_a_measure(tmp_path: Path) -> None:
    src = tmp_path / "pages-1.img"
    src.write_bytes(b"x" * 1000)
    packed = tmp_path / "p.kbz"
    blob = snapshot_pages.zlib.compress(b"x" * 999, 1)
    packed.write_bytes(blob)
    frame = snapshot_pages._Frame(src, 0, 1000)
    with pytest.raises(ValueError, match="unpacked to 999 bytes, 1000 were packed"):
        snapshot_pages._unpack_all(packed, [frame], [len(blob)], tmp_path, 1)


def test_the_pack_probe_says_so_rather_than_fill_a_tmpfs_too_small(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = _snapshot(tmp_path / "snap")
    monkeypatch.setattr(
        snapshot_pages.shutil, "disk_usage", lambda p: snapshot_pages.shutil._ntuple_diskusage(9, 9, 100)
    )
    drops: list[int] = []
    doc = snapshot_pages.pack_probe(
        snapshot_pages.page_files(snap), tmp_path / "work", lambda: drops.append(1) is None
    )
    assert doc["skipped"].endswith(f"has 100 B free, the unpacked pages need {doc['bytes']} B") and not drops
    assert not (tmp_path / "work").exists()
