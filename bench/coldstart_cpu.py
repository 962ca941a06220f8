"""Cold start of the tiny-llama CPU image: the first compiled call with the baked caches vs
with caches disabled (``KERNELBAKE_CACHE=off``: the preflight points Inductor at an empty dir).

    python bench/coldstart_cpu.py --image 127.0.0.1:5000/kernelbake/tiny-llama@sha256:...

Runs warm and cold containers alternately, prints JSON and writes it to
bench/results/coldstart_cpu.json. Times come from inside the container (the torch server's
ready line); the container's wall time is reported beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGET_SPEEDUP = 5.0
RESULTS = Path(__file__).resolve().parent / "results" / "coldstart_cpu.json"


def _run(image: str, cold: bool) -> dict[str, Any]:
    argv = ["docker", "run", "--rm"]
    if cold:
        argv += ["-e", "KERNELBAKE_CACHE=off"]
    argv += [image, "--warmup-only"]
    start = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        sys.exit(f"coldstart_cpu: {' '.join(argv)} failed:\n{res.stderr[-2000:]}")
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("{") and '"ready"' in ln)
    ready: dict[str, Any] = json.loads(line)
    return {
        "first_call_s": ready["first_call_s"],
        "warmup_s": ready["warmup_s"],
        "container_s": round(wall, 3),
        "counters": ready["counters"],
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in ("first_call_s", "warmup_s", "container_s"):
        values = [r[field] for r in runs]
        out[field] = {"median": round(statistics.median(values), 3), "runs": values}
    out["counters"] = runs[-1]["counters"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--image", required=True, help="the tiny-llama CPU image (digest reference)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    warm, cold = [], []
    for _ in range(args.runs):
        warm.append(_run(args.image, cold=False))
        cold.append(_run(args.image, cold=True))
    w, c = _summary(warm), _summary(cold)
    speedup = c["first_call_s"]["median"] / w["first_call_s"]["median"]
    result = {
        "benchmark": "coldstart_cpu",
        "image": args.image,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "runs": args.runs,
        "warm": w,
        "cold": c,
        "speedup_first_call": round(speedup, 2),
        "speedup_warmup": round(c["warmup_s"]["median"] / w["warmup_s"]["median"], 2),
        "speedup_container": round(c["container_s"]["median"] / w["container_s"]["median"], 2),
        "target_speedup": TARGET_SPEEDUP,
        "meets_target": speedup >= TARGET_SPEEDUP,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    text = json.dumps(result, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return 0 if result["meets_target"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
