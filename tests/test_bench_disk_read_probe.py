"""bench/disk_read_probe.py without a disk to measure: the files it writes, and that each count
of readers drops the page cache first and reads every byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import bench

disk_read_probe = bench.load("disk_read_probe")


def test_files_are_shard_sized_and_every_reader_count_reads_them_all_after_a_drop(tmp_path: Path) -> None:
    files = disk_read_probe.write_files(tmp_path / "w", 2500, shard=1000)
    assert [p.stat().st_size for p in files] == [1000, 1000, 500]
    # Random bytes, as weights are: nothing a disk could compress.
    assert len(set(files[0].read_bytes())) > 200
    drops: list[int] = []
    reads = disk_read_probe.measure(files, [1, 3], drop=lambda: drops.append(1))
    assert drops == [1, 1]
    assert [(r["workers"], r["bytes"]) for r in reads] == [(1, 2500), (3, 2500)]


def test_without_root_it_stops_rather_than_measure_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse() -> None:
        raise PermissionError("Permission denied")

    monkeypatch.setattr(disk_read_probe, "drop_page_cache", refuse)
    assert disk_read_probe.main(["--dir", str(tmp_path / "w"), "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "w").exists()


def test_with_will_need_the_kernel_is_asked_for_every_file_after_the_drop(tmp_path: Path) -> None:
    files = disk_read_probe.write_files(tmp_path / "w", 2500, shard=1000)
    order: list[str] = []
    reads = disk_read_probe.measure(
        files,
        [2],
        drop=lambda: order.append("drop"),
        advise=lambda fs: order.append(f"advise {len(fs)}"),
    )
    assert order == ["drop", "advise 3"]
    assert reads[0]["will_need"] is True and reads[0]["bytes"] == 2500
    # The real call takes every file (no error on a file the page cache already holds).
    disk_read_probe.will_need(files)
