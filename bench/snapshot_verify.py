"""What serve's snapshot gate costs per start for the files (issue 40 item 2): before, every
file's sha256 at every start; after, the same where the files must be hashed, and only their
listing, types and sizes on an image volume the runtime pulled by digest.

    sudo .venv/bin/python bench/snapshot_verify.py [--shape cpu|beside] [--gb 2.23] [--runs 3] \
        [--out bench/results/snapshot_verify.json]

A snapshot is written with random bytes and a snapshot.json, in one of two shapes:

- ``cpu``: the CPU image's (bench/results/snapshot_cpu.json: 113 files, 2.23 GB; five page files,
  one per process, the /dev/shm copies, small CRIU images);
- ``beside``: a GPU snapshot taken with its weights beside (the FP8 MoE on the H100, 2026-12-07:
  34.8 GB in 209 files, 90 % of it weight files of about 1 GB, one 2.7 GB page file).

Timed, each ``--runs`` times with the files in the page cache (a restore reads them right after
the gate, so the gate's reads are what brings them in on a cold node; both are disk-bound there
alike):

- ``sha256_mb_s``: hashlib's sha256 on a 256 MiB buffer in memory, one thread (this CPU's rate);
- ``before_s``: the gate's file check as it was until 2026-12-07, every file hashed on one thread;
- ``hashed_s``: the gate's check now where the snapshot is no pulled image volume (a directory,
  a bind mount): sizes, then every file hashed by ``hashing.workers()`` threads (``threads``);
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

from kernelbake.contract.key import parse_key
from kernelbake.contract.snapshot import (
    SNAPSHOT_MANIFEST,
    SnapshotFile,
    SnapshotKey,
    SnapshotManifest,
    Weights,
    env_digest,
)
from kernelbake.runtime.snapshot import hashing, restore, volume

MB = 1_000_000
# Shares of the whole of the CPU image's snapshot: page files of the five processes, the
# /dev/shm copies, and 100 small CRIU image files of 4 KiB.
PAGES = (0.54, 0.14, 0.09, 0.02, 0.02)
SHM = (0.045, 0.045, 0.045, 0.045)
SMALL = 100
# The MoE's with its weights beside: one large page file (2.70 of 34.82 GB), three small ones,
# 30 weight files sharing 90 %, and 170 small CRIU images.
BESIDE_PAGES = (0.0775, 0.0125, 0.005, 0.005)
BESIDE_WEIGHTS = 30
BESIDE_SMALL = 170


def shape(name: str, total: int) -> dict[str, int]:
    """File sizes by path for a snapshot of ``total`` bytes in the shape ``name``."""
    if name == "cpu":
        sizes = {f"images/pages-{i + 1}.img": int(total * s) for i, s in enumerate(PAGES)}
        sizes |= {f"images/dev-shm/psm_{i}": int(total * s) for i, s in enumerate(SHM)}
        return sizes | {f"images/core-{i}.img": 4096 for i in range(SMALL)}
    sizes = {f"images/pages-{i + 1}.img": int(total * s) for i, s in enumerate(BESIDE_PAGES)}
    part = int(total * (1 - sum(BESIDE_PAGES)) / BESIDE_WEIGHTS)
    sizes |= {f"images/weights/rank-0/part-{i:04d}.bin": part for i in range(BESIDE_WEIGHTS)}
    return sizes | {f"images/core-{i}.img": 4096 for i in range(BESIDE_SMALL)}


# Any key will do (the gate's file check reads only the files); one written out here, so that
# the bench needs nothing but the standard library and src/ (it runs on the device machine too).
_CACHE_KEY = (
    "kb1:engine=vllm;engine_version=0.32.0;torch=2.13.0;triton=3.7.1;cuda=13.0;flashinfer=0.7.0.post1;"
    "python=3.12;arch=sm_90a;device=NVIDIA%20H100%2080GB%20HBM3;driver_floor=580.65.06;"
    "model=local/qwen3-30b-a3b-fp8-sleep;revision=sha256-"
    + "4f"
    * 32
    + ";model_path=/models/qwen3-30b-a3b-fp8;"
    "dtype=bfloat16;quantization=fp8;tp=1;pp=1;ep=1;max_model_len=8192;max_num_batched_tokens=4096;"
    "compilation=44136fa355b3678a;engine_env=4f53cda18c2baa0c;kernelbake=0.1.0"
)


def _key() -> SnapshotKey:
    return SnapshotKey(
        image="sha256:" + "a" * 64,
        cache_key=parse_key(_CACHE_KEY),
        gpu="none",
        gpu_count=0,
        driver="none",
        cuda_driver_api="none",
        kernel=os.uname().release,
        criu="4.1.1",
        criu_features="none",
        cpu="any",
        cpu_flags="sse",
        serve_args='["vllm", "serve"]',
        serve_env=env_digest({"A": "1"}),
        weights=Weights.INSIDE,
    )


def write_snapshot(root: Path, total: int, kind: str = "cpu") -> SnapshotManifest:
    """Random files of the shape ``kind`` under ``root/images``, and its snapshot.json."""
    sizes = shape(kind, total)
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


def timed(fn: Any, runs: int) -> tuple[float, Any]:
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
    ap.add_argument("--shape", choices=("cpu", "beside"), default="cpu")
    ap.add_argument("--gb", type=float, default=2.23)
    ap.add_argument("--runs", type=int, default=3)
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
        manifest = write_snapshot(lower, int(args.gb * 1e9), args.shape)
        doc["snapshot"] = {
            "shape": args.shape,
            "files": len(manifest.files),
            "bytes": manifest.total_bytes,
            "written_s": round(time.monotonic() - t, 1),
        }
        doc["sha256_mb_s"] = sha256_rate()
        doc["before_s"], found = timed(lambda: before(lower, manifest), args.runs)
        assert found == [], found
        doc["threads"] = hashing.workers()
        doc["hashed_s"], (found, pulled) = timed(lambda: after(lower, manifest), args.runs)
        assert found == [] and pulled is None, (found, pulled)
        # Two lower layers and no upper one: containerd's view of a two-layer image volume.
        subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={empty}:{lower}", str(mnt)],
            check=True,
        )
        try:
            doc["pulled_s"], (found, pulled) = timed(lambda: after(mnt, manifest), args.runs)
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
        "hashed_threads": doc["threads"],
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
