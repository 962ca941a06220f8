"""Whether take's NVML release lets CRIU dump a process the driver has checkpointed, on a GPU
machine, without vLLM (docs/snapshot.md, 'NVML's device files').

vLLM 0.32's engine core still held /dev/nvidiactl, /dev/nvidia0 and /dev/nvidia-caps/* after
the driver's checkpoint on the H100 (bench/results/vllm-0.32.0-h100-snapshot-2026-12-05-fourth),
which is what NVML keeps open: torch.cuda.device_count() initialises it before CUDA is up and
never shuts it down. This starts torch processes that do exactly that and hold 1 GiB on the
GPU: one with kernelbake's handler (``kernelbake.runtime.nvml``, as vLLM's plugin installs it
when take starts the engine), one without, and two whose GPU work runs in a child they fork or
spawn, as vLLM's API server starts its engine core; and runs take's own steps on each: the
driver's checkpoint, ``take._release_nvml``, the device files left; then, for each whose files
all closed, ``criu dump``, ``criu restore``, the driver's restore, and the data checked.

Its first runs (H100, bench/results/vllm-0.32.0-h100-snapshot-2026-12-06-fifth) had only the
first two: both closed every file at the checkpoint, with torch 2.11 and 2.13, so NVML in a
process's own hands was never the engine core's trouble. Files inherited through a fork are:
the fork experiments there kept all five after the checkpoint.

    PYTHONPATH=src python3 bench/nvml_release_probe.py --criu /opt/kernelbake-criu/bin/criu --out DIR

Prints JSON; writes DIR/nvml-release-probe.json.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernelbake.runtime import nvml
from kernelbake.runtime.snapshot import take, tree
from kernelbake.runtime.snapshot.criu import Criu, failure
from kernelbake.runtime.snapshot.driver import CudaDriver, machine_driver

CHILD = r"""
import os, sys, time
from pathlib import Path


def work(d, handler):
    if handler:
        # Again in a spawned child, which runs none of the parent's code (vLLM's plugin
        # installs it in every process vLLM starts); a forked one has it already.
        from kernelbake.runtime import nvml
        nvml.install()
    import torch
    x = torch.rand(1 << 28, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    want = float(x.double().sum())
    torch.cuda.empty_cache()
    (d / "ready").write_text(str(os.getpid()))
    while True:
        if (d / "go").exists():
            (d / "go").unlink()
            got = float(x.double().sum())
            (d / "result").write_text("intact" if got == want else f"changed {want} -> {got}")
        time.sleep(0.05)


if __name__ == "__main__":
    mode, d = sys.argv[1], Path(sys.argv[2])
    handler = mode != "plain"
    if handler:
        from kernelbake.runtime import nvml
        nvml.install()
    import torch
    torch.cuda.device_count()  # before CUDA is up: NVML initialised, never shut down (torch)
    if mode in ("forked", "spawned"):
        # As vLLM's API server starts its engine core: the GPU is used by a child.
        import multiprocessing
        ctx = multiprocessing.get_context("fork" if mode == "forked" else "spawn")
        ctx.Process(target=work, args=(d, handler)).start()
        while True:
            time.sleep(1)
    work(d, handler)
"""
# plain: no handler; handler: kernelbake's, as vLLM's plugin installs it; forked and spawned:
# the handler in both processes, and the GPU used by a child the NVML-holding parent started
# (vLLM's engine core: forked by kernelbake's default, spawned for a snapshot).
MODES = ("plain", "handler", "forked", "spawned")
_PR_SET_CHILD_SUBREAPER = 36


def _wait_for(path: Path, seconds: float) -> str | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists() and (text := path.read_text()):
            return text
        time.sleep(0.05)
    return None


def one(mode: str, driver: CudaDriver, criu: Criu | None, work: Path) -> dict[str, Any]:
    d = work / mode
    d.mkdir(parents=True)
    out: dict[str, Any] = {"mode": mode}
    script = d / "child.py"
    script.write_text(CHILD)
    with (d / "child.log").open("w") as log:
        child = subprocess.Popen(
            [sys.executable, str(script), mode, str(d)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
    pid = restored_root = child.pid
    checkpointed = False
    try:
        if (ready := _wait_for(d / "ready", 120)) is None:
            out["failed"] = f"the child did not start: {(d / 'child.log').read_text()[-400:]}"
            return out
        # The process that holds the GPU: the child, or the one it started.
        pid = int(ready)
        out["gpu_in"] = "the child" if pid == child.pid else "the child's child"
        out["files_before"] = tree.gpu_files(pid)
        t = time.monotonic()
        driver.checkpoint(pid)
        checkpointed = True
        out["checkpoint_s"] = round(time.monotonic() - t, 3)
        out["files_after_checkpoint"] = tree.gpu_files(pid)
        out["catches_release_signal"] = tree.catches(pid, nvml.RELEASE_SIGNAL)
        t = time.monotonic()
        out["asked"] = take._release_nvml([pid]) == [pid]
        out["release_s"] = round(time.monotonic() - t, 3)
        out["files_after_release"] = tree.gpu_files(pid)
        if out["files_after_release"] or criu is None:
            return out
        images = d / "images"
        images.mkdir()
        t = time.monotonic()
        # The whole tree from its root, the session leader CRIU asks for (the spawned mode's
        # GPU process is not one: "The root process 1394 is not a session leader", 2026-12-06).
        ok, dump_log = criu.dump(child.pid, images, d)
        out["dump_s"] = round(time.monotonic() - t, 3)
        if not ok:
            out["failed"] = f"criu dump: {failure(Path(dump_log))}"
            return out
        child.wait()
        checkpointed = False
        out["images_bytes"] = sum(f.stat().st_size for f in images.iterdir())
        t = time.monotonic()
        ok, restore_log = criu.restore(images, d, d / "restored.pid")
        out["criu_restore_s"] = round(time.monotonic() - t, 3)
        if not ok:
            out["failed"] = f"criu restore: {failure(Path(restore_log))}"
            return out
        # Every process comes back with its pid: the GPU one is still ``pid``.
        restored_root = int((d / "restored.pid").read_text())
        t = time.monotonic()
        driver.restore(pid)
        out["driver_restore_s"] = round(time.monotonic() - t, 3)
        (d / "go").write_text("1")
        out["after_restore"] = _wait_for(d / "result", 60) or "no answer in 60 s"
        out["child_log"] = (d / "child.log").read_text()[-300:]
    except Exception as exc:
        out["failed"] = f"{type(exc).__name__}: {exc}"
    finally:
        if checkpointed:
            try:
                driver.restore(pid)
            except Exception as exc:
                out["give_back_failed"] = str(exc)
        for gone in {pid, child.pid, restored_root}:
            with contextlib.suppress(OSError):
                os.kill(gone, 9)
        if child.poll() is None:
            child.wait()
        if restored_root != child.pid:
            # Adopted here (the subreaper), so reaped here.
            with contextlib.suppress(OSError):
                os.waitpid(restored_root, 0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--criu", type=Path, default=None)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    doc: dict[str, Any] = {"bench": "nvml_release_probe", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ")}
    doc["machine"] = subprocess.run(
        "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r; "
        "python3 -c 'import torch; print(torch.__version__)'",
        shell=True, capture_output=True, text=True,
    ).stdout.split("\n")  # fmt: skip
    # The restored process is criu's child, and criu exits (-d): adopted here, not by init.
    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    driver = machine_driver()
    if not isinstance(driver, CudaDriver):
        doc["failed"] = "no CUDA device here"
    else:
        criu = Criu(a.criu) if a.criu else None
        with tempfile.TemporaryDirectory(prefix="nvml-probe-", dir="/dev/shm") as work:
            doc["runs"] = [one(mode, driver, criu, Path(work)) for mode in MODES]
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "nvml-release-probe.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
