"""What serve's snapshot gate costs per start for the files (issue 40 item 2): before, every
file's sha256 at every start; after, the same where the files must be hashed, and only their
listing, types and sizes on an image volume the runtime pulled by digest.

    sudo .venv/bin/python bench/snapshot_verify.py [--gb 2.23] [--out bench/results/snapshot_verify.json]

A snapshot of the CPU image's shape (bench/results/snapshot_cpu.json: 113 files, 2.23 GB; five
page files, one per process, the /dev/shm copies, small CRIU images) is written with random bytes
and a snapshot.json. Timed, each three times with the files in the page cache (a restore reads
them right after the gate, so the gate's reads are what brings them in on a cold node; both are
disk-bound there alike):

- ``sha256_mb_s``: hashlib's sha256 on a 256 MiB buffer in memory, one thread (this CPU's rate);
- ``before_s``: the gate's file check as it was, every file hashed on one thread;
- ``hashed_s``: the gate's check now where the snapshot is no pulled image volume (a directory,
  a bind mount): every file hashed, as before (the same code path, timed again);
- ``pulled_s``: the gate's check now on a real read-only overlay of two lower layers (how
  containerd mounts a two-layer image volume), after ``volume.pulled_by_runtime`` recognised it
  from /proc/self/mountinfo: no file read.

Needs root (``mount -t overlay``); the overlay is unmounted and the files removed at the end.
Prints JSON and writes it to ``--out`` with the host's load average.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernelbake.contract.snapshot import SNAPSHOT_MANIFEST, SnapshotFile, SnapshotManifest
from kernelbake.runtime.snapshot import restore, volume

MB = 1_000_000
# Shares of the whole of the CPU image's snapshot: page files of the five processes, the
# /dev/shm copies, and 100 small CRIU image files of 4 KiB.
PAGES = (0.54, 0.14, 0.09, 0.02, 0.02)
SHM = (0.045, 0.045, 0.045, 0.045)
SMALL = 100


def _key() -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.contract.test_snapshot import cpu_key

    return cpu_key()


def write_snapshot(root: Path, total: int) -> SnapshotManifest:
    """Random files of the CPU snapshot's shape under ``root/images``, and its snapshot.json."""
    sizes = {f"images/pages-{i + 1}.img": int(total * s) for i, s in enumerate(PAGES)}
    sizes |= {f"images/dev-shm/psm_{i}": int(total * s) for i, s in enumerate(SHM)}
    sizes |= {f"images/core-{i}.img": 4096 for i in range(SMALL)}
    block = os.urandom(1 << 20)
    files = []
    for rel, size in sizes.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        with p.open("wb") as fh:
            left, n = size, 0
            while left:
                # Each MiB differs (a counter), so no layer of the stack can dedupe it.
                chunk = (n.to_bytes(8, "little") + block[8:])[: min(left, len(block))]
                fh.write(chunk)
                h.update(chunk)
                left -= len(chunk)
                n += 1
        files.append(SnapshotFile(path=rel, size=size, sha256=h.hexdigest()))
    manifest = SnapshotManifest(
        key=_key(),
        files=tuple(files),
        tree=((1001, "python3 -m kernelbake serve"),),
        health_port=8000,
        health_path="/health",
        deadline_s=30.0,
    )
    (root / SNAPSHOT_MANIFEST).write_text(manifest.to_json())
    return manifest


def before(root: Path, manifest: SnapshotManifest) -> list[str]:
    """The gate's file check as it was: sizes, then each file's sha256 on this thread."""
    problems = []
    for f in manifest.files:
        p = root / f.path
        if p.lstat().st_size != f.size:
            problems.append(f.path)
            continue
        h = hashlib.sha256()
        with p.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != f.sha256:
            problems.append(f.path)
    return problems


def after(root: Path, manifest: SnapshotManifest) -> tuple[list[str], str | None]:
    pulled = volume.pulled_by_runtime(root)
    return list(restore._file_problems(root, manifest, hashed=pulled is None)), pulled


def timed(fn: Any, runs: int = 3) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(runs):
        t = time.monotonic()
        out = fn()
        best = min(best, time.monotonic() - t)
    return round(best, 4), out


def sha256_rate() -> float:
    buf = os.urandom(256 << 20)
    t = time.monotonic()
    hashlib.sha256(buf).digest()
    return round(len(buf) / MB / (time.monotonic() - t), 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=2.23)
    ap.add_argument("--out", type=Path, default=Path("bench/results/snapshot_verify.json"))
    ap.add_argument("--work", type=Path, default=Path("/var/tmp"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("snapshot_verify: needs root (mount -t overlay)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="kb-snapverify-", dir=args.work))
    lower, empty, mnt = work / "layer-images", work / "layer-json", work / "mnt"
    for d in (lower, empty, mnt):
        d.mkdir()
    doc: dict[str, Any] = {"host": {"cpus": os.cpu_count(), "kernel": os.uname().release}}
    doc["host"]["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
    try:
        t = time.monotonic()
        manifest = write_snapshot(lower, int(args.gb * 1e9))
        doc["snapshot"] = {
            "files": len(manifest.files),
            "bytes": manifest.total_bytes,
            "written_s": round(time.monotonic() - t, 1),
        }
        doc["sha256_mb_s"] = sha256_rate()
        doc["before_s"], found = timed(lambda: before(lower, manifest))
        assert found == [], found
        doc["hashed_s"], (found, pulled) = timed(lambda: after(lower, manifest))
        assert found == [] and pulled is None, (found, pulled)
        # Two lower layers and no upper one: containerd's view of a two-layer image volume.
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={empty}:{lower}", str(mnt)],
            check=True,
        )
        try:
            doc["pulled_s"], (found, pulled) = timed(lambda: after(mnt, manifest))
            assert found == [] and pulled is not None, (found, pulled)
            doc["pulled_reason"] = pulled
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    doc["host"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    rate = doc["snapshot"]["bytes"] / doc["before_s"]
    # The H200 snapshots (bench/results/vllm-0.26.0-h200-snapshot-2026-12-04) at this host's
    # one-thread rate: an extrapolation, not a measurement on that host.
    doc["extrapolated_before_s"] = {
        "qwen3-8b weights inside (26.07 GB)": round(26.07e9 / rate, 1),
        "qwen3-8b weights out (4.43 GB)": round(4.43e9 / rate, 1),
    }
    doc["summary"] = {
        "snapshot_bytes": doc["snapshot"]["bytes"],
        "per_start_before_s": doc["before_s"],
        "per_start_hashed_s": doc["hashed_s"],
        "per_start_pulled_volume_s": doc["pulled_s"],
        "sha256_mb_s_one_thread": doc["sha256_mb_s"],
    }
    text = json.dumps(doc, indent=1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
