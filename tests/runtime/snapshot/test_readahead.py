"""The weight files read beside a restore: which (the index's, not another copy beside them),
how much (a budget), and nothing where there is nothing to read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelbake.runtime.snapshot import readahead


def _model(tmp_path: Path, *, index: bool) -> Path:
    model = tmp_path / "model"
    model.mkdir(parents=True)
    for name, size in (
        ("model-00001-of-00002.safetensors", 3000),
        ("model-00002-of-00002.safetensors", 2000),
    ):
        (model / name).write_bytes(b"w" * size)
    # Mistral's layout: the same weights once more, in one file the loader skips given an index.
    (model / "consolidated.safetensors").write_bytes(b"c" * 5000)
    (model / "config.json").write_text("{}")
    if index:
        weight_map = {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
            "c": "../x",
        }
        (model / readahead.INDEX).write_text(json.dumps({"weight_map": weight_map}))
    return model


def test_the_index_names_the_files_and_without_one_every_safetensors_file_is_read(tmp_path: Path) -> None:
    indexed = _model(tmp_path / "a", index=True)
    assert [p.name for p in readahead.weight_files(indexed)] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    plain = _model(tmp_path / "b", index=False)
    assert [p.name for p in readahead.weight_files(plain)] == [
        "consolidated.safetensors",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


def test_reading_stops_at_the_budget_and_passes_over_what_cannot_be_read(tmp_path: Path) -> None:
    model = _model(tmp_path, index=True)
    files = readahead.weight_files(model)
    assert readahead.read(files, 10_000) == 5000
    assert readahead.read(files, 3500) == 3500
    assert readahead.read([tmp_path / "gone.safetensors", *files], 10_000) == 5000


def test_memory_available_is_the_node_s_within_the_container_s_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemAvailable:   100000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    # No cgroup files: the node's figure.
    assert readahead.available_bytes(meminfo, cgroup) == 100000 * 1024
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("5000\n")
    assert readahead.available_bytes(meminfo, cgroup) == 100000 * 1024
    # A limit: what it leaves, where that is less than the node's.
    (cgroup / "memory.max").write_text("65000\n")
    assert readahead.available_bytes(meminfo, cgroup) == 60000
    (cgroup / "memory.current").write_text("70000\n")
    assert readahead.available_bytes(meminfo, cgroup) == 0
    (cgroup / "memory.max").write_text(f"{1 << 40}\n")
    assert readahead.available_bytes(meminfo, cgroup) == 100000 * 1024
    assert readahead.available_bytes(tmp_path / "absent", cgroup) == 0
    # cgroup v1's files (the same reader as the snapshot gate's): its page cache is not room.
    v1 = tmp_path / "v1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("65000\n")
    (v1 / "memory.usage_in_bytes").write_text("5000\n")
    (v1 / "memory.stat").write_text("cache 4000\nshmem 0\n")
    assert readahead.available_bytes(meminfo, v1.parent) == 60000


def test_a_thread_reads_where_there_is_something_to_read_and_says_how_far_it_got(tmp_path: Path) -> None:
    assert readahead.start(tmp_path / "nothing-here", limit=1 << 20) is None
    model = _model(tmp_path, index=False)
    assert readahead.start(model, limit=0) is None
    ahead = readahead.start(model, limit=8000)
    assert ahead is not None and ahead.thread.daemon
    ahead.thread.join(timeout=10)
    assert not ahead.thread.is_alive()
    assert ahead.said() == "8000 B read ahead beside it (the snapshot's 0 image files, then 3 weight files)"
    # The snapshot's images first: CRIU reads them before the reload reads the weights.
    image = tmp_path / "pages-1.img"
    image.write_bytes(b"p" * 700)
    ahead = readahead.start(model, limit=1000, images=[image])
    assert ahead is not None and ahead.files[0] == image
    ahead.thread.join(timeout=10)
    assert ahead.said() == "1000 B read ahead beside it (the snapshot's 1 image file, then 3 weight files)"
    # Images alone are worth reading: CRIU reads them whatever the model's directory holds.
    alone = readahead.start(tmp_path / "nothing-here", limit=1000, images=[image])
    assert alone is not None
    alone.thread.join(timeout=10)
    assert alone.done == 700


def test_pieces_go_out_in_the_reload_s_order_and_several_readers_read_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readahead, "_RANGE", 1000)
    model = _model(tmp_path, index=True)
    files = readahead.weight_files(model)
    first, second = files
    assert readahead.ranges(files, 4500) == [
        (first, 0, 1000),
        (first, 1000, 1000),
        (first, 2000, 1000),
        (second, 0, 1000),
        (second, 1000, 500),
    ]
    ahead = readahead.ReadAhead(files, 10_000, workers=3)
    assert readahead.read(files, 10_000, ahead, workers=3) == 5000
    assert ahead.done == 5000
