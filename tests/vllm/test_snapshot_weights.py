"""The weights a snapshot keeps beside its process image (``--weights beside``): saved from the
engine's weight allocations and copied back to the same addresses, here with host memory
standing in for the device's (``ctypes.memmove`` for ``cudaMemcpy``), so every byte can be
compared."""

from __future__ import annotations

import ctypes
import importlib
import json
import os
from pathlib import Path

import pytest

from kernelbake.contract.snapshot import LOAD_WEIGHTS, SAVE_WEIGHTS, WEIGHTS_EXTENSION
from kernelbake.runtime.engines.vllm import snapshot_weights as sw


class Memory:
    """Allocations of host memory, each with its address as the allocator would report it."""

    def __init__(self, sizes: list[int], seed: int = 1) -> None:
        self.buffers = [ctypes.create_string_buffer(n) for n in sizes]
        for b in self.buffers:
            ctypes.memmove(b, os.urandom(len(b.raw)) if seed else bytes(len(b.raw)), len(b.raw))

    def allocations(self, asleep: bool = False) -> list[sw.Allocation]:
        return [sw.Allocation(ctypes.addressof(b), len(b.raw), asleep) for b in self.buffers]

    def contents(self) -> list[bytes]:
        return [b.raw for b in self.buffers]

    def zero(self) -> None:
        for b in self.buffers:
            ctypes.memset(b, 0, len(b.raw))


def copy(dst: int, src: int, n: int) -> None:
    ctypes.memmove(dst, src, n)


def staging(size: int = 1000) -> sw.Staging:
    raw = bytearray(size)
    return sw.Staging(
        address=ctypes.addressof((ctypes.c_char * size).from_buffer(raw)), view=memoryview(raw), owner=raw
    )


SIZES = [4096, 2500, 1, 10_000, 999]


@pytest.fixture(autouse=True)
def no_spare(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real disk is asked, but without the 8 GiB kept for the dump: CI's disk may have less.
    monkeypatch.setattr(sw, "SPARE_BYTES", 0)


def test_saved_weights_come_back_byte_for_byte_to_the_same_addresses(tmp_path: Path) -> None:
    memory = Memory(SIZES)
    before = memory.contents()
    saved = sw.save(tmp_path / "w", memory.allocations(), copy, staging(), part_bytes=8000)
    assert saved["bytes"] == sum(SIZES) and saved["blocks"] == len(SIZES)
    parts = sorted(p.name for p in (tmp_path / "w").glob("part-*.bin"))
    assert len(parts) >= 2 and saved["files"] == len(parts)
    memory.zero()
    assert memory.contents() != before
    # Chunks of 1000 B through three staging buffers, in three threads.
    loaded = sw.load(tmp_path / "w", memory.allocations(), copy, staging, workers=3)
    assert memory.contents() == before
    assert loaded["bytes"] == saved["bytes"]


def test_parts_hold_whole_allocations_in_address_order() -> None:
    allocations = [
        sw.Allocation(ptr, size)
        for ptr, size in ((0x9000, 10_000), (0x1000, 4096), (0x3000, 2500), (0x5000, 1), (0xF000, 999))
    ]
    # About 8000 B a part, no allocation split: 4096+2500+1 | 10000 | 999.
    assert [(b.ptr, b.file, b.offset) for b in sw.layout(allocations, 8000)] == [
        (0x1000, "part-0000.bin", 0),
        (0x3000, "part-0000.bin", 4096),
        (0x5000, "part-0000.bin", 6596),
        (0x9000, "part-0001.bin", 0),
        (0xF000, "part-0002.bin", 0),
    ]


def test_allocations_that_are_not_the_recorded_ones_get_nothing(tmp_path: Path) -> None:
    memory = Memory(SIZES)
    sw.save(tmp_path / "w", memory.allocations(), copy, staging())
    other = Memory([*SIZES[:-1], 998], seed=0)
    with pytest.raises(sw.WeightsMismatch) as info:
        sw.load(tmp_path / "w", other.allocations(), copy, staging)
    assert "recorded not here" in str(info.value) and "here not recorded" in str(info.value)
    assert all(set(c) == {0} for c in other.contents())
    with pytest.raises(sw.WeightsMismatch, match="1 recorded not here"):
        sw.load(tmp_path / "w", memory.allocations()[:-1], copy, staging)


def test_an_engine_asleep_is_neither_saved_from_nor_copied_into(tmp_path: Path) -> None:
    memory = Memory(SIZES)
    with pytest.raises(sw.WeightsMismatch, match="the engine sleeps"):
        sw.save(tmp_path / "w", memory.allocations(asleep=True), copy, staging())
    sw.save(tmp_path / "w", memory.allocations(), copy, staging())
    with pytest.raises(sw.WeightsMismatch, match="the engine sleeps"):
        sw.load(tmp_path / "w", memory.allocations(asleep=True), copy, staging)
    with pytest.raises(sw.WeightsMismatch, match="no weight allocations"):
        sw.save(tmp_path / "empty", [], copy, staging())


def test_save_writes_only_into_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "x").write_text("")
    with pytest.raises(FileExistsError):
        sw.save(tmp_path / "w", Memory(SIZES).allocations(), copy, staging())


def test_a_short_part_file_is_refused_before_anything_is_copied(tmp_path: Path) -> None:
    memory = Memory(SIZES)
    sw.save(tmp_path / "w", memory.allocations(), copy, staging())
    part = tmp_path / "w" / "part-0000.bin"
    part.write_bytes(part.read_bytes()[:-1])
    memory.zero()
    with pytest.raises(sw.WeightsMismatch, match=r"part-0000\.bin: .* the index needs"):
        sw.load(tmp_path / "w", memory.allocations(), copy, staging)
    assert all(set(c) == {0} for c in memory.contents())


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda d: d["blocks"][0].update(file="../part-0000.bin"), "not a plain file name"),
        (lambda d: d["blocks"][0].update(size=-1), "sizes >= 0"),
        (lambda d: d.update(schema=2), "schema 2"),
        (lambda d: d.pop("blocks"), "not a weights index"),
    ],
)
def test_an_index_of_another_shape_is_refused(tmp_path: Path, edit: object, said: str) -> None:
    memory = Memory(SIZES)
    sw.save(tmp_path / "w", memory.allocations(), copy, staging())
    index = tmp_path / "w" / sw.INDEX
    doc = json.loads(index.read_text())
    edit(doc)  # type: ignore[operator]
    index.write_text(json.dumps(doc))
    with pytest.raises(sw.WeightsMismatch, match=said):
        sw.read_index(tmp_path / "w")


def test_a_copy_that_fails_in_a_thread_fails_the_load(tmp_path: Path) -> None:
    memory = Memory(SIZES)
    sw.save(tmp_path / "w", memory.allocations(), copy, staging())

    def broken(dst: int, src: int, n: int) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        sw.load(tmp_path / "w", memory.allocations(), broken, staging, workers=2)


def test_the_extension_take_and_serve_name_is_this_class_with_both_methods() -> None:
    module, _, name = WEIGHTS_EXTENSION.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert cls is sw.SnapshotWeights
    assert callable(getattr(cls, SAVE_WEIGHTS)) and callable(getattr(cls, LOAD_WEIGHTS))
    # vLLM mixes the class into its worker and refuses a name the worker has: every one here
    # carries kernelbake's prefix.
    assert [n for n in vars(cls) if not n.startswith("__")] == [SAVE_WEIGHTS, LOAD_WEIGHTS]


def test_each_rank_saves_into_and_copies_from_its_own_folder() -> None:
    class Worker:
        rank = 3

    assert sw.rank_folder("/snap/images/weights", Worker()) == Path("/snap/images/weights/rank-3")
    assert sw.rank_folder("/w", object()) == Path("/w/rank-0")


def test_a_disk_without_room_for_the_weights_is_said_before_a_byte_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = Memory(SIZES)
    monkeypatch.setattr(sw, "SPARE_BYTES", 1000)
    need = sum(SIZES) + 1000
    monkeypatch.setattr(sw, "disk_free", lambda folder: need - 1)
    with pytest.raises(sw.WeightsMismatch, match=f"is {sum(SIZES)} B and {need - 1} B are free"):
        sw.save(tmp_path / "w", memory.allocations(), copy, staging())
    assert list((tmp_path / "w").iterdir()) == []
    monkeypatch.setattr(sw, "disk_free", lambda folder: need)
    assert sw.save(tmp_path / "w", memory.allocations(), copy, staging())["bytes"] == sum(SIZES)
