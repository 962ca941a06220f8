"""Does ``criu restore --file-validation filesize`` take away the wait on mapped files that a
cold restore shows while the disk is busy with other reads?

Qwen3-8B restored with its weights beside on the H100 (2026-12-07), page cache dropped: 5.78 s
of its 9.61 s ``criu restore`` waited after the opening of its 3,715 file mappings, against
0.01 s warm, while serve's four readers read the 16.6 GB of weights. CRIU's default check of a
mapped file (``buildid``) reads the first MiB of each ELF file again to compare its build-id;
``filesize`` compares the size alone (the gate pins the image those files come from, so it
would lose nothing).

Measured (bench/results/criu_validation_probe-*-2026-12-07.json): no. On the H200's host (16
cores, 8 GB read beside, 332 mapping opens of a python that imported torch 2.11) the restore's
median is 4.67 s checked by build-id and 4.63 s by size; the wait after mapping opens falls
(0.67 → 0.37 s) and the wait on page reads grows as much (0.59 → 1.48 s): the disk is the bound
either way. Here (2 cores, 6 GB beside, 224 opens): 2.19 against 2.55 s, within this host's
noise (every other restore is ~1.7 s slower, whichever way it checks; the rounds alternate
the order so that both ways share it). kernelbake keeps CRIU's default.

The probe dumps one process (by default a python that imported torch: hundreds of mapped
libraries), then restores it ``--rounds`` times each way, alternating, each time with the page
cache dropped and ``--readers`` threads reading ``--contend-gb`` of other files meanwhile, as
serve's read-ahead does. Per restore: the wall time of ``criu restore -d`` and its log's time by
work (bench/criu_log.py). Standard library only; run as root where CRIU can dump and restore
(the device, or a privileged container with ``--init``, which reaps the restored processes):

    docker run --rm --init --privileged --network none -v "$PWD:/kb:ro" -v /tmp/out:/out \\
      -v "$PWD/build/criu:/opt/kernelbake-criu:ro" kernelbake/cpu-base:bookworm-torch2.13.0 \\
      python3 /kb/bench/criu_validation_probe.py --criu /opt/kernelbake-criu/bin/criu \\
      --work /tmp/probe --out /out/criu_validation_probe.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from criu_log import criu_time_by_work
from snapshot_pages import drop_caches

MODES = ("buildid", "filesize")
VICTIM = "import torch, time; x = torch.ones(1 << 26); print('ready', flush=True); time.sleep(3600)"
_CHUNK = 16 << 20


def start_victim(code: str, work: Path) -> int:
    """The process to dump, in a session of its own, its output in a file; its pid once ready."""
    out = work / "victim.out"
    with out.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=fh,
            stderr=fh,
            start_new_session=True,
        )
    deadline = time.monotonic() + 120
    while "ready" not in out.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the process to dump did not say ready: {out.read_text()[-2000:]}")
        time.sleep(0.2)
    return proc.pid


def write_contention(work: Path, gb: float, readers: int) -> list[Path]:
    """``readers`` files of random bytes, ``gb`` in all (random: nothing can shortcut reading them)."""
    each = int(gb * 1e9) // readers
    files = []
    for i in range(readers):
        path = work / f"contend-{i}.bin"
        with path.open("wb") as fh:
            left = each
            while left > 0:
                fh.write(os.urandom(min(_CHUNK, left)))
                left -= _CHUNK
        files.append(path)
    return files


def _read(path: Path, stop: threading.Event) -> None:
    with path.open("rb", buffering=0) as fh:
        while not stop.is_set() and fh.read(_CHUNK):
            pass


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return not Path(f"/proc/{pid}").exists()


def restore_once(criu: str, images: Path, mode: str, contend: Sequence[Path], n: int) -> dict[str, Any]:
    """One restore with the page cache dropped and ``contend`` read meanwhile; the restored tree
    killed after it."""
    log, pidfile = images / f"restore-{n}-{mode}.log", images.parent / "restored.pid"
    pidfile.unlink(missing_ok=True)
    dropped = drop_caches()
    stop = threading.Event()
    readers = [threading.Thread(target=_read, args=(p, stop), daemon=True) for p in contend]
    for t in readers:
        t.start()
    started = time.monotonic()
    done = subprocess.run(
        [criu, "restore", "-d", "-D", str(images), "-o", log.name, "-v4", "--pidfile", str(pidfile),
         "--file-validation", mode],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    wall = time.monotonic() - started
    stop.set()
    for t in readers:
        t.join()
    text = log.read_text(errors="replace") if log.is_file() else ""
    row: dict[str, Any] = {"mode": mode, "ok": done.returncode == 0, "page_cache_dropped": dropped}
    row["restore_s"] = round(wall, 3)
    row["by_work"] = criu_time_by_work(text)
    if done.returncode != 0:
        row["error"] = (done.stderr or text)[-600:]
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGKILL)
        row["killed"] = _gone(pid)
    return row


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, over the restores that succeeded: the median wall time and the median seconds
    waited after mapping opens and after page reads."""

    def waited(row: dict[str, Any], kind: str) -> float:
        return float(row["by_work"].get(kind, {}).get("waited_s", 0.0))

    out: dict[str, Any] = {}
    for mode in MODES:
        ok = [r for r in rows if r["mode"] == mode and r["ok"]]
        if not ok:
            out[mode] = {"restores": 0}
            continue
        out[mode] = {
            "restores": len(ok),
            "restore_s_median": round(statistics.median(r["restore_s"] for r in ok), 3),
            "mappings_waited_s_median": round(
                statistics.median(waited(r, "opening file mappings") for r in ok), 3
            ),
            "pages_waited_s_median": round(statistics.median(waited(r, "reading pages") for r in ok), 3),
            "mapping_opens": max(r["by_work"].get("opening file mappings", {}).get("lines", 0) for r in ok),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--criu", default="criu")
    ap.add_argument(
        "--work", type=Path, required=True, help="a folder on the disk to measure (made, emptied)"
    )
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--contend-gb", type=float, default=6.0)
    ap.add_argument("--victim", default=VICTIM, help="python code that prints 'ready' and waits")
    ap.add_argument(
        "--modes", nargs="+", choices=MODES, default=list(MODES), help="in the first round's order"
    )
    a = ap.parse_args(argv)
    a.work.mkdir(parents=True, exist_ok=True)
    images = a.work / "images"
    images.mkdir(exist_ok=True)
    contend = write_contention(a.work, a.contend_gb, a.readers) if a.contend_gb > 0 else []
    pid = start_victim(a.victim, a.work)
    dump = subprocess.run(
        [a.criu, "dump", "-t", str(pid), "-D", str(images), "-o", "dump.log", "-v4"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if dump.returncode != 0:
        raise SystemExit(f"criu dump failed: {(images / 'dump.log').read_text(errors='replace')[-2000:]}")
    # Each round in the other order, so that neither way always follows the other.
    order = [(n, mode) for n in range(a.rounds) for mode in (a.modes if n % 2 == 0 else a.modes[::-1])]
    rows = [restore_once(a.criu, images, mode, contend, n) for n, mode in order]
    doc = {
        "bench": "criu_validation_probe",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "contend_gb": a.contend_gb,
        "readers": a.readers,
        "summary": summary(rows),
        "restores": rows,
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
