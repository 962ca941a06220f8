"""What the GPU half of a process snapshot costs on this machine (docs/snapshot.md).

A CRIU + cuda-checkpoint snapshot first has the driver move a process's device state into
its host memory (``cuCheckpointProcessLock`` then ``cuCheckpointProcessCheckpoint``); CRIU
then dumps the process, GPU state included, like any other. Restoring runs it backwards:
CRIU restores, then ``cuCheckpointProcessRestore`` and ``cuCheckpointProcessUnlock`` put the
device state back. This times the driver's half, on a child process that holds N GiB of
random data on the GPU and a captured CUDA graph, and checks that both are intact after:
the data by a checksum, the graph by replaying it. CRIU itself is not on the device
machine (no network, no package), so the dump to disk and the restore of the process image
are not measured here; their floor is the bytes written and read at the disk's rate.

    python3 bench/vllm_snapshot_probe.py --gib 4 --gib 16 --out DIR

Prints JSON; writes DIR/snapshot-probe.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# CUprocessState (cuda.h, CUDA 12.8+).
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}

CHILD = r"""
import sys, torch
gib = float(sys.argv[1])
n = int(gib * (1 << 30) // 4)
g = torch.Generator(device="cuda").manual_seed(1234)
x = torch.rand(n, device="cuda", generator=g)
w = torch.rand(1024, 1024, device="cuda", generator=g)
a = torch.rand(64, 1024, device="cuda", generator=g)
# cuBLAS sets up its workspace on a first call, which a capture cannot hold: warm it first.
y = a @ w; torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    y = a @ w
graph.replay(); torch.cuda.synchronize()
want = (float(x.double().sum()), float(y.double().sum()))
# The float64 copy behind that sum stays reserved by torch's caching allocator (twice the
# data): given back, so the device memory the driver checkpoints is the data, not 3x it.
torch.cuda.empty_cache()
print("ready", torch.cuda.memory_reserved(), flush=True)
for line in sys.stdin:
    graph.replay(); torch.cuda.synchronize()
    got = (float(x.double().sum()), float(y.double().sum()))
    print("intact" if got == want else f"changed {want} -> {got}", flush=True)
"""


class Driver:
    def __init__(self) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self._check(self.cuda.cuInit(0), "cuInit")

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self.cuda.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {rc} ({(name.value or b'?').decode()})")

    def state(self, pid: int) -> str:
        s = ctypes.c_int(-1)
        self._check(self.cuda.cuCheckpointProcessGetState(pid, ctypes.byref(s)), "GetState")
        return STATES.get(s.value, str(s.value))

    def call(self, name: str, pid: int, timeout_ms: int = 0) -> float:
        # Every *Args struct is 64 bytes of reserved fields, the lock's first field its timeout.
        args = (ctypes.c_uint32 * 16)()
        args[0] = timeout_ms
        t0 = time.monotonic()
        self._check(getattr(self.cuda, f"cuCheckpointProcess{name}")(pid, ctypes.byref(args)), name)
        return round(time.monotonic() - t0, 3)


def _rss_gib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / (1 << 20), 2)
    return -1.0


def probe(driver: Driver, gib: float) -> dict[str, Any]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(gib)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    out: dict[str, Any] = {"gib_on_gpu": gib}
    try:
        ready = child.stdout.readline().split()
        if not ready or ready[0] != "ready":
            out["failed"] = "child did not start"
            return out
        out["torch_reserved_gib"] = round(int(ready[1]) / (1 << 30), 2)
        pid = child.pid
        out["rss_before_gib"] = _rss_gib(pid)
        out["lock_s"] = driver.call("Lock", pid, timeout_ms=10_000)
        out["checkpoint_s"] = driver.call("Checkpoint", pid)
        out["state_after_checkpoint"] = driver.state(pid)
        out["rss_checkpointed_gib"] = _rss_gib(pid)
        out["restore_s"] = driver.call("Restore", pid)
        out["unlock_s"] = driver.call("Unlock", pid)
        out["state_after_unlock"] = driver.state(pid)
        child.stdin.write("verify\n")
        child.stdin.flush()
        out["after_restore"] = child.stdout.readline().strip()
        # Rates over what the driver moved, read as the host memory the checkpoint added.
        moved = out["rss_checkpointed_gib"] - out["rss_before_gib"]
        out["moved_to_host_gib"] = round(moved, 2)
        for k in ("checkpoint_s", "restore_s"):
            out[k.replace("_s", "_gib_per_s")] = round(moved / out[k], 1) if out[k] else None
    except Exception as exc:
        out["failed"] = f"{type(exc).__name__}: {exc}"
    finally:
        child.kill()
        child.wait()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    doc: dict[str, Any] = {"bench": "vllm_snapshot_probe", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
    tools = subprocess.run(
        "command -v criu cuda-checkpoint; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r",
        shell=True,
        capture_output=True,
        text=True,
    )
    doc["machine"] = tools.stdout.strip().splitlines()
    try:
        driver = Driver()
        doc["runs"] = [probe(driver, g) for g in (a.gib or [4.0])]
    except Exception as exc:
        doc["failed"] = f"{type(exc).__name__}: {exc}"
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "snapshot-probe.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
