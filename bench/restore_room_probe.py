"""What a restore does on a GPU whose memory another process holds (issue 40: safe on a machine
it does not fit).

The snapshot's key names the GPU model, so a restore on another card is refused before it
starts; the same card with its memory taken (another replica, a stray process) matches every
field. This measures what the product's code then meets: a child holding N GiB and a CUDA graph
is checkpointed by the driver (``driver.CudaDriver``) and dumped by CRIU (``criu.Criu``); a hog
then takes all but ``--leave`` GiB of the device; CRIU restores the process (host memory: no
GPU needed) and the driver is asked to restore its device state. Recorded: each call's time,
the driver's answer and the process's state after it, and whether a second driver restore,
after the hog is gone, brings the process back with its data intact, and if not, whether a
fresh ``criu restore`` from the same images then does (what a later start on the node would
meet; H100, 2026-12-07: the second restore fails, the fresh one works). Also what serve's gate
(``restore.no_device_room``) says, given the child's rise in NVML's used memory (what take
records as ``device_bytes``), with the hog and after it.

    PYTHONPATH=src python3 bench/restore_room_probe.py --gib 16 --leave 4 \
        --criu /opt/kernelbake-criu/bin/criu --images /dev/shm/rr --out DIR

Prints JSON; writes DIR/restore-room-probe.json.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernelbake.errors import EnvironmentProblem
from kernelbake.runtime.snapshot.criu import Criu, failure
from kernelbake.runtime.snapshot.driver import CudaDriver, machine_driver, rise
from kernelbake.runtime.snapshot.restore import no_device_room

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dump_room_probe import child_not_ready, start_child, wait_for
from vllm_snapshot_probe import STATES

HOG = r"""
import sys, time, torch
leave, ready = float(sys.argv[1]), sys.argv[2]
free, total = torch.cuda.mem_get_info()
take = max(free - int(leave * (1 << 30)), 0)
blocks = []
while take >= 1 << 28:
    blocks.append(torch.empty(1 << 28, dtype=torch.uint8, device="cuda"))
    take -= 1 << 28
open(ready, "w").write(str(len(blocks) << 28))
while True:
    time.sleep(1)
"""


def _state(lib: ctypes.CDLL, pid: int) -> str:
    state = ctypes.c_int(-1)
    rc = lib.cuCheckpointProcessGetState(pid, ctypes.byref(state))
    return STATES.get(state.value, str(state.value)) if rc == 0 else f"CUresult {rc}"


def _timed(r: dict[str, Any], what: str, call: Any) -> bool:
    t = time.monotonic()
    try:
        call()
        ok, said = True, "ok"
    except EnvironmentProblem as exc:
        ok, said = False, str(exc)
    r[what] = {"s": round(time.monotonic() - t, 2), "said": said}
    return ok


def _criu_restore(r: dict[str, Any], what: str, criu: Criu, images: Path, work: Path, pidfile: Path) -> int:
    """``criu restore`` of ``images``, timed into ``r[what]``: the restored pid, or 0 with
    CRIU's reason in ``r["error"]``."""
    t = time.monotonic()
    ok, log_path = criu.restore(images, work, pidfile, timeout=300)
    r[what] = {"s": round(time.monotonic() - t, 2), "ok": ok}
    if not ok:
        r["error"] = failure(Path(log_path))
        return 0
    return int(pidfile.read_text())


def wait_gone(pid: int, timeout_s: float = 30.0) -> None:
    """Until ``pid`` is gone (CRIU gives the next restore the same pid)."""
    end = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < end:
        time.sleep(0.05)


def probe(gib: float, leave: float, criu: Criu, images: Path) -> dict[str, Any]:
    driver = machine_driver()
    if not isinstance(driver, CudaDriver):
        return {"error": "no GPU answers here"}
    lib = ctypes.CDLL("libcuda.so.1")
    work = Path(tempfile.mkdtemp(prefix="rr-work-"))
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir(parents=True)
    verdict, hog_ready = work / "verdict", work / "hog"
    r: dict[str, Any] = {"gib": gib, "leave_gib": leave}
    idle = driver.memory()
    child = start_child(gib, work, verdict)
    hog: subprocess.Popen[bytes] | None = None
    restored = 0
    try:
        if error := child_not_ready(child, work):
            r["error"] = error
            return r
        # What take records as device_bytes (NVML's rise), and what serve's gate says of it.
        r["device_bytes"] = held = rise(idle, driver.memory())
        _timed(r, "checkpoint", lambda: driver.checkpoint(child.pid))
        t = time.monotonic()
        ok, log_path = criu.dump(child.pid, images, work)
        r["dump"] = {"s": round(time.monotonic() - t, 2), "ok": ok}
        if not ok:
            r["error"] = failure(Path(log_path))
            return r
        child.wait()
        hog = subprocess.Popen(
            [sys.executable, "-c", HOG, str(leave), str(hog_ready)], start_new_session=True
        )
        if not wait_for(hog_ready, hog, 120):
            r["error"] = "the hog did not get ready"
            return r
        r["hog_bytes"] = int(hog_ready.read_text())
        with_hog = driver.memory()
        r["memory_with_hog"] = [dataclasses.asdict(m) for m in with_hog]
        r["gate_with_hog"] = no_device_room(held, with_hog)
        pidfile = work / "pid"
        if not (restored := _criu_restore(r, "criu_restore", criu, images, work, pidfile)):
            return r
        r["state_after_criu"] = _state(lib, restored)
        r["first_restore_ok"] = _timed(r, "driver_restore", lambda: driver.restore(restored))
        r["state_after_driver"] = _state(lib, restored)
        hog.kill()
        hog.wait()
        time.sleep(1)
        r["gate_after_hog"] = no_device_room(held, driver.memory())
        r["second_restore_ok"] = _timed(r, "driver_restore_again", lambda: driver.restore(restored))
        r["state_after_second"] = _state(lib, restored)
        if not r["second_restore_ok"]:
            # The restored process cannot be given its device state any more (2026-12-07, H100:
            # CUDA_ERROR_OPERATING_SYSTEM): what a restore from the same images does now that the
            # memory is free, which is what a later start on this node would meet.
            subprocess.run(["kill", "-KILL", str(restored)])
            wait_gone(restored)
            pidfile.unlink()  # CRIU will not write over it
            if not (restored := _criu_restore(r, "criu_restore_again", criu, images, work, pidfile)):
                return r
            r["fresh_restore_ok"] = _timed(r, "driver_restore_fresh", lambda: driver.restore(restored))
            r["state_after_fresh"] = _state(lib, restored)
        if r["second_restore_ok"] or r["first_restore_ok"] or r.get("fresh_restore_ok"):
            subprocess.run(["kill", "-USR1", str(restored)])
            r["data"] = verdict.read_text() if wait_for(verdict, None, 60) else "no verdict in 60 s"
        return r
    finally:
        for p in (child, hog):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        if restored:
            subprocess.run(["kill", "-KILL", str(restored)])
        shutil.rmtree(images, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=16.0)
    ap.add_argument("--leave", type=float, default=4.0, help="GiB of the device the hog leaves free")
    ap.add_argument("--criu", type=Path, default=Path("/opt/kernelbake-criu/bin/criu"))
    ap.add_argument("--images", type=Path, default=Path("/dev/shm/restore-room"))
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    criu = Criu(a.criu)
    doc: dict[str, Any] = {
        "bench": "restore_room_probe",
        "command": "python3 bench/restore_room_probe.py " + " ".join(sys.argv[1:]),
        "criu": criu.version(),
        "device": str(machine_driver().facts()),
        "run": probe(a.gib, a.leave, criu, a.images),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "restore-room-probe.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0 if "error" not in doc["run"] else 1


if __name__ == "__main__":
    sys.exit(main())
