"""Does take's room check cover what CRIU then writes, on a GPU process (issue 40, docs/snapshot.md)?

``kernelbake snapshot take`` refuses a dump that would not fit where it goes before CRIU runs
(``take._room``): once the driver's checkpoint has moved a process's device state into its
host memory, the dump is about that memory (``tree.dumped_bytes``: Anonymous, Swap and
Pss_Shmem of smaps_rollup) plus CRIU's own slack (``take.DUMP_SLACK``). On the CPU that was
checked in CI; whether the driver's copy of the device state shows up in those fields is a
property of the driver, seen only on a GPU. This asks it of the product's own code:

for each size, a child that holds N GiB on the GPU and a captured CUDA graph; the driver's
checkpoint (``driver.machine_driver``); the estimate (``tree.dumped_bytes``) and the room
check's verdict on the real images folder and, as root, on a tmpfs of half the estimate;
then ``criu dump`` (``criu.Criu``) and the bytes it wrote. Where no GPU answers, the same on
the CPU (the driver's calls are no-ops), as CI runs it.

    PYTHONPATH=src python3 bench/dump_room_probe.py --gib 4 --gib 16 \
        --criu /opt/kernelbake-criu/bin/criu --images /dev/shm/room --out DIR

Prints JSON; writes DIR/dump-room-probe.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernelbake.runtime.snapshot import take, tree
from kernelbake.runtime.snapshot.criu import Criu, failure
from kernelbake.runtime.snapshot.driver import NoDriver, machine_driver

# The child both probes start (restore_room_probe.py too): N GiB and a captured CUDA graph on the
# GPU, or N GiB of touched host memory without one. Given a verdict file, it checks its own data
# on SIGUSR1 and writes what it found there (its stdout is a file CRIU restores at the size it
# had, so nothing is printed after the dump); the check's float64 copy is made only then.
CHILD = r"""
import signal, sys, time
gib, ready = float(sys.argv[1]), sys.argv[2]
verdict = sys.argv[3] if len(sys.argv) > 3 else None
try:
    import torch
    cuda = torch.cuda.is_available()
except ImportError:
    cuda = False
if cuda:
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.rand(int(gib * (1 << 30) // 4), device="cuda", generator=g)
    w = torch.rand(1024, 1024, device="cuda", generator=g)
    a = torch.rand(64, 1024, device="cuda", generator=g)
    y = a @ w  # cuBLAS sets up its workspace on a first call, which a capture cannot hold
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = a @ w
    def sums():
        graph.replay()
        torch.cuda.synchronize()
        return (float(x.double().sum()), float(y.double().sum()))
else:
    x = bytearray(int(gib * (1 << 30)))
    x[:: 1 << 12] = b"\1" * len(x[:: 1 << 12])  # touched, so resident and dumped
    def sums():
        return (x.count(1),)
if verdict:
    want = sums()
    def check(*_):
        got = sums()
        open(verdict, "w").write("intact" if got == want else f"changed {want} -> {got}")
    signal.signal(signal.SIGUSR1, check)
if cuda:
    torch.cuda.empty_cache()  # what the checks reserved given back: the device holds the data
open(ready, "w").write("ready")
while True:
    time.sleep(0.2)
"""


def start_child(gib: float, work: Path, verdict: Path | None = None) -> subprocess.Popen[bytes]:
    """CHILD holding ``gib`` GiB, in its own session (CRIU dumps it without --shell-job), its
    output in ``work``/child.log; ``work``/ready appears once it holds them."""
    with (work / "child.log").open("w") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                str(gib),
                str(work / "ready"),
                *([str(verdict)] if verdict else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )


def wait_for(path: Path, proc: subprocess.Popen[bytes] | None, seconds: float) -> bool:
    """Whether ``path`` appeared within ``seconds`` (False at once if ``proc`` ended first)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def child_not_ready(proc: subprocess.Popen[bytes], work: Path, seconds: float = 300) -> str | None:
    """Why the child of ``start_child`` is not ready within ``seconds`` (its log's end), or None."""
    if wait_for(work / "ready", proc, seconds):
        return None
    return "the child did not get ready: " + (work / "child.log").read_text()[-400:]


def _bytes_under(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def _small_tmpfs(size: int) -> Path | None:
    """A tmpfs of ``size`` bytes (root only), so the refusal is asked of a real filesystem."""
    if os.geteuid() != 0:
        return None
    where = Path(tempfile.mkdtemp(prefix="room-small-"))
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]).returncode == 0
    return where if ok else None


def probe(gib: float, criu: Criu, images_root: Path) -> dict[str, Any]:
    driver = machine_driver()
    work = Path(tempfile.mkdtemp(prefix="room-work-"))
    images = images_root / f"{gib:g}gib"
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir(parents=True)
    proc = start_child(gib, work)
    r: dict[str, Any] = {"gib": gib, "gpu": not isinstance(driver, NoDriver)}
    try:
        if error := child_not_ready(proc, work):
            r["error"] = error
            return r
        r["before_checkpoint_bytes"] = tree.dumped_bytes(proc.pid)
        t = time.monotonic()
        driver.checkpoint(proc.pid)
        r["checkpoint_s"] = round(time.monotonic() - t, 2)
        estimate = tree.dumped_bytes(proc.pid)
        r["estimate_bytes"] = estimate
        r["need_bytes"] = estimate + take.DUMP_SLACK
        # The verdicts take would give: on the real folder, and on one that cannot hold it.
        # An empty folder as /dev/shm: the child keeps nothing there.
        shm = work / "shm"
        shm.mkdir()
        r["room_check_here"] = take._room([proc.pid], images, shm=shm)[1]
        if small := _small_tmpfs(max(estimate // 2, 1 << 20)):
            r["room_check_half"] = take._room([proc.pid], small, shm=shm)[1]
            subprocess.run(["umount", str(small)])
            small.rmdir()
        t = time.monotonic()
        ok, dump_log = criu.dump(proc.pid, images, work)
        r["dump_s"] = round(time.monotonic() - t, 2)
        if not ok:
            r["error"] = f"criu dump failed: {failure(Path(dump_log))}"
            driver.restore(proc.pid)
            return r
        r["written_bytes"] = _bytes_under(images)
        r["covered"] = r["need_bytes"] >= r["written_bytes"]
        r["estimate_over_written"] = round(estimate / r["written_bytes"], 4)
        return r
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        shutil.rmtree(images, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, action="append", default=[])
    ap.add_argument("--criu", type=Path, default=Path("/opt/kernelbake-criu/bin/criu"))
    ap.add_argument("--images", type=Path, default=Path("/dev/shm/dump-room"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    criu = Criu(a.criu)
    doc: dict[str, Any] = {
        "bench": "dump_room_probe",
        "command": "python3 bench/dump_room_probe.py " + " ".join(sys.argv[1:]),
        "criu": criu.version(),
        "slack_bytes": take.DUMP_SLACK,
        "runs": [probe(g, criu, a.images) for g in a.gib or [1.0]],
    }
    doc["device"] = dataclasses.asdict(machine_driver().facts()) if doc["runs"][0].get("gpu") else "cpu"
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "dump-room-probe.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(json.dumps(doc, indent=1, default=str))
    return 0 if all(r.get("covered") for r in doc["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
