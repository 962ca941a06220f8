"""The engine's weight memory saved beside a process snapshot at take and copied back after
its restore (``kernelbake snapshot take --weights beside``, issue 40).

A snapshot taken asleep leaves vLLM's weights out of the process image (sleep mode level 2
frees them), and a restore of one taken ``--weights outside`` reloads them from the checkpoint:
the model's loader, then each layer's processing. On the FP8 MoE that reload took 13.93 s of a
16.71 s restore with every byte in the page cache (H100, vLLM 0.32, 2026-12-06), most of it
spent loading 128 experts a layer one by one, not reading. What the engine holds once loaded is
already in its kernels' layout, and vLLM's sleep-mode allocator (``CuMemAllocator``) tags every
allocation made while loading ``weights`` and maps each back at the same address when it wakes.
So take writes those allocations' bytes to files, with each one's address and size
(``index.json``), and the restore, after the wake-up, copies the bytes back to the same
addresses: every weight, scale and buffer the loading made, whatever the model, with no loader.
Exact by construction, and checked: the restored process's weight allocations must be the ones
recorded, address and size, or nothing is copied and the call fails (serve then kills the
restore and starts the baked way).

Runs in vLLM's worker, as its worker extension (``contract.snapshot.WEIGHTS_EXTENSION``, called
through ``/collective_rpc``); the allocator and the device copy are the release adapter's
(``VllmLookups.weight_allocations`` and ``device_copy``). What needs no GPU (the layout, the
files, the check, the copying through any copy function) is tested with host memory standing in
for the device's (tests/vllm/test_snapshot_weights.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

INDEX = "index.json"
SCHEMA = 1
# A file's size: several files are read side by side at restore, and each is hashed and
# listed on its own; one allocation is never split between two.
PART_BYTES = 1 << 30
# One copy's size, through a staging buffer of host memory the device copies from or to.
CHUNK = 64 << 20
# Threads that copy back at restore, each with its own staging buffer: one reads a chunk from
# the page cache while another's chunk goes to the device.
WORKERS = 4
MAX_INDEX_BYTES = 64 << 20
# Left free beside the weights for the index and the engine's log. The dump's own room is asked
# of the tree by take before CRIU runs (its memory then, which holds the device state: CRIU's
# images of an asleep engine were 3.5-4.4 GB on the GPU), not guessed here: a fixed 8 GiB
# refused a CI machine's take of a 9 MB stand-in with 3.6 GB free.
SPARE_BYTES = 256 << 20


def disk_free(folder: Path) -> int:
    return shutil.disk_usage(folder).free


# (destination address, source address, bytes): the device's copy, or memmove in the tests.
Copy = Callable[[int, int, int], None]


class WeightsMismatch(RuntimeError):
    """The saved weights do not fit the engine they are copied into; nothing was copied."""


@dataclasses.dataclass(frozen=True)
class Allocation:
    ptr: int
    size: int
    # Unmapped (the engine sleeps): no copy may touch it.
    asleep: bool = False


@dataclasses.dataclass(frozen=True)
class Block:
    """One allocation's bytes: at ``offset`` of ``file``."""

    ptr: int
    size: int
    file: str
    offset: int


@dataclasses.dataclass
class Staging:
    """Host memory a chunk passes through: its address for the copy, a view of it for the file,
    and whatever keeps it alive (the pinned tensor on the GPU)."""

    address: int
    view: memoryview
    owner: Any = None


def layout(allocations: Sequence[Allocation], part_bytes: int = PART_BYTES) -> list[Block]:
    """Where each allocation's bytes go, in address order: files ``part-0000.bin`` … of about
    ``part_bytes`` each."""
    blocks: list[Block] = []
    part, offset = 0, 0
    for a in sorted(allocations, key=lambda a: a.ptr):
        if offset and offset + a.size > part_bytes:
            part, offset = part + 1, 0
        blocks.append(Block(ptr=a.ptr, size=a.size, file=f"part-{part:04d}.bin", offset=offset))
        offset += a.size
    return blocks


def _chunks(block: Block, chunk: int) -> Iterator[tuple[int, int]]:
    """(offset within the block, length) of each copy."""
    for start in range(0, block.size, chunk):
        yield start, min(chunk, block.size - start)


def _awake(allocations: Sequence[Allocation], what: str) -> None:
    if asleep := [a for a in allocations if a.asleep]:
        raise WeightsMismatch(
            f"{len(asleep)} of the engine's {len(allocations)} weight allocations are not mapped "
            f"(the engine sleeps): {what} only an engine that is awake"
        )


def save(
    folder: Path,
    allocations: Sequence[Allocation],
    copy: Copy,
    staging: Staging,
    part_bytes: int = PART_BYTES,
) -> dict[str, Any]:
    """Every allocation's bytes written to files in ``folder`` (new or empty) and the index
    last: what was written."""
    _awake(allocations, "the weights are saved from")
    if not allocations:
        raise WeightsMismatch("the engine has no weight allocations (is vLLM's sleep mode on?)")
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        raise FileExistsError(f"{folder}: not empty; the weights are saved only into an empty folder")
    blocks = layout(allocations, part_bytes)
    need = sum(b.size for b in blocks) + SPARE_BYTES
    if (free := disk_free(folder)) < need:
        # Said before a byte is written: the device's disk filled halfway through a take of
        # the MoE's 31 GB (H100, 2026-12-06), and the engine's log said only ENOSPC.
        raise WeightsMismatch(
            f"{folder}: the engine's weight memory is {need - SPARE_BYTES} B and {free} B are free "
            f"there ({SPARE_BYTES} B kept spare); take the snapshot onto a larger disk"
        )
    chunk = len(staging.view)
    for name in dict.fromkeys(b.file for b in blocks):
        with (folder / name).open("wb") as f:
            for b in (b for b in blocks if b.file == name):
                for start, n in _chunks(b, chunk):
                    copy(staging.address, b.ptr + start, n)
                    f.write(staging.view[:n])
    doc = {"schema": SCHEMA, "blocks": [dataclasses.asdict(b) for b in blocks]}
    (folder / INDEX).write_text(json.dumps(doc, sort_keys=True))
    return _done(blocks, started)


def _done(blocks: Sequence[Block], started: float) -> dict[str, Any]:
    return {
        "blocks": len(blocks),
        "files": len({b.file for b in blocks}),
        "bytes": sum(b.size for b in blocks),
        "seconds": round(time.monotonic() - started, 3),
    }


def read_index(folder: Path) -> list[Block]:
    """The saved blocks, checked to be the index's own shape: plain file names in ``folder``,
    non-negative sizes and offsets."""
    path = folder / INDEX
    try:
        if path.stat().st_size > MAX_INDEX_BYTES:
            raise WeightsMismatch(f"{path}: over {MAX_INDEX_BYTES} B")
        doc = json.loads(path.read_text())
        blocks = [
            Block(ptr=int(b["ptr"]), size=int(b["size"]), file=str(b["file"]), offset=int(b["offset"]))
            for b in doc["blocks"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WeightsMismatch(f"{path}: not a weights index ({exc})") from None
    if doc.get("schema") != SCHEMA:
        raise WeightsMismatch(f"{path}: schema {doc.get('schema')!r}, this reads {SCHEMA}")
    for b in blocks:
        if "/" in b.file or b.file in ("", ".", "..") or min(b.ptr, b.size, b.offset) < 0:
            raise WeightsMismatch(f"{path}: block {b} is not a plain file name with sizes >= 0")
    return blocks


def mismatch(recorded: Sequence[Block], live: Sequence[Allocation]) -> list[str]:
    """How the engine's weight allocations differ from the recorded ones (address and size),
    the first few of each kind; empty where they are the same."""
    was = {(b.ptr, b.size) for b in recorded}
    now = {(a.ptr, a.size) for a in live}
    out = []
    if gone := sorted(was - now):
        out.append(f"{len(gone)} recorded not here, first {_shown(gone)}")
    if new := sorted(now - was):
        out.append(f"{len(new)} here not recorded, first {_shown(new)}")
    return out


def _shown(pairs: Sequence[tuple[int, int]]) -> str:
    return ", ".join(f"{size} B at {ptr:#x}" for ptr, size in pairs[:3])


def load(
    folder: Path,
    allocations: Sequence[Allocation],
    copy: Copy,
    staging: Callable[[], Staging],
    workers: int = WORKERS,
) -> dict[str, Any]:
    """The saved bytes copied back to the addresses they came from, by ``workers`` threads
    (each with a staging buffer from ``staging``); what was copied. Refused before any copy
    where the engine's allocations are not the recorded ones or a file is short."""
    started = time.monotonic()
    blocks = read_index(folder)
    _awake(allocations, "the weights are copied into")
    if found := mismatch(blocks, allocations):
        raise WeightsMismatch(
            f"the engine's weight allocations are not those saved in {folder}: {'; '.join(found)}"
        )
    for name in {b.file for b in blocks}:
        need = max(b.offset + b.size for b in blocks if b.file == name)
        if (size := (folder / name).stat().st_size) < need:
            raise WeightsMismatch(f"{folder / name}: {size} B, the index needs {need} B")
    _copy_back(folder, blocks, copy, staging, workers)
    return _done(blocks, started)


def _copy_back(
    folder: Path, blocks: Sequence[Block], copy: Copy, staging: Callable[[], Staging], workers: int
) -> None:
    # Made here, in the caller's thread: on the GPU a pinned buffer is made with the engine's
    # device current.
    buffers = [staging() for _ in range(max(1, workers))]
    pieces = iter([(b, start, n) for b in blocks for start, n in _chunks(b, len(buffers[0].view))])
    lock = threading.Lock()
    failed: list[BaseException] = []

    def work(buf: Staging) -> None:
        fds: dict[str, int] = {}
        try:
            while not failed:
                with lock:
                    piece = next(pieces, None)
                if piece is None:
                    return
                b, start, n = piece
                fd = fds.get(b.file)
                if fd is None:
                    fd = fds[b.file] = os.open(folder / b.file, os.O_RDONLY)
                if os.preadv(fd, [buf.view[:n]], b.offset + start) != n:
                    raise WeightsMismatch(f"{folder / b.file}: short read at {b.offset + start}")
                copy(b.ptr + start, buf.address, n)
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)
        finally:
            for fd in fds.values():
                os.close(fd)

    threads = [threading.Thread(target=work, args=(buf,), daemon=True) for buf in buffers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]


class SnapshotWeights:
    """vLLM's worker extension (``--worker-extension-cls``): the two methods take and serve call
    through ``/collective_rpc`` (``contract.snapshot.SAVE_WEIGHTS``, ``LOAD_WEIGHTS``). vLLM
    mixes this class into its worker, so the names carry kernelbake's prefix."""

    def kernelbake_save_weights(self, path: str) -> dict[str, Any]:
        import torch

        lookups = _lookups()
        torch.cuda.synchronize()
        try:
            return save(rank_folder(path, self), _allocations(lookups), lookups.device_copy, _pinned())
        finally:
            _release_pinned()

    def kernelbake_load_weights(self, path: str) -> dict[str, Any]:
        import torch

        lookups = _lookups()
        device = torch.cuda.current_device()

        def copy(dst: int, src: int, n: int) -> None:
            # A thread's first CUDA call would use device 0: the engine's, whatever it is.
            torch.cuda.set_device(device)
            lookups.device_copy(dst, src, n)

        try:
            done = load(rank_folder(path, self), _allocations(lookups), copy, _pinned)
            torch.cuda.synchronize()
        finally:
            _release_pinned()
        return done


def rank_folder(path: str, worker: Any) -> Path:
    """Each worker's own folder under ``path`` (``rank-N``, its global rank): with tensor
    parallelism every rank holds other weights at other addresses, and each saves and copies
    back its own."""
    return Path(path) / f"rank-{int(getattr(worker, 'rank', 0))}"


def _lookups() -> Any:
    from kernelbake.runtime.engines.vllm.compat_layer import lookups

    return lookups()


def _allocations(lookups: Any) -> list[Allocation]:
    return [Allocation(ptr, size, asleep) for ptr, size, asleep in lookups.weight_allocations()]


def _pinned() -> Staging:
    import torch

    t = torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True)
    return Staging(address=t.data_ptr(), view=memoryview(t.numpy()), owner=t)


def _release_pinned() -> None:
    """The staging buffers' pinned memory given back: torch keeps freed pinned blocks cached in
    the process, and at take the process is dumped next (its pages would carry them)."""
    import torch

    if empty := getattr(torch._C, "_host_emptyCache", None):
        empty()
