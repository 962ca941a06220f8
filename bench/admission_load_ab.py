"""The admission load bench, this tree's server against another revision's, alternating.

Host load moves the tail latencies of ``bench/admission_load.py`` far more than any change to
the server does (2026-12-04: p99 at 200 concurrent from 27 ms on an idle host to 600 ms at load
15), so one run per side says little. Here both sides run in turns, for each concurrency and
round, the order flipped every round; the old side is the other revision's own bench script
with its ``src`` first on PYTHONPATH (``git archive REV | tar -x -C DIR``: the whole tree). Each
run records the 1-minute load average before it, and the summary compares medians.

    git archive d6fcc27 | tar -x -C /tmp/old
    .venv/bin/python bench/admission_load_ab.py --old-src /tmp/old/src --old-rev d6fcc27 \\
        [--rounds 2] [--concurrency 500,200,50] [--out bench/results/admission_load_ab.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "admission_load_ab.json"
# The steady-state part of admission_load.py: warm waves, a few first reviews, no burst.
BENCH_ARGS = ["--burst", "0", "--reviews", "2000", "--fresh", "5"]
# Warm reviews per run: admission_load's default 20 waves are 1,000 reviews at 50 concurrent.
WARM_REVIEWS = 10_000
# What admission_load records of the warm waves besides latency: CPU per review on each side of
# the connection and the connections the load generator opened (``Spent``).
SPENT = (
    "server_cpu_ms_per_review",
    "client_cpu_ms_per_review",
    "cpu_share_of_host",
    "connections_opened",
    "connections_closed_by_server",
)


def waves(concurrency: int, warm_reviews: int) -> int:
    """Waves for about ``warm_reviews`` reviews at ``concurrency``; admission_load's 20 at least."""
    return max(20, warm_reviews // concurrency)


def one_run(side: str, concurrency: int, old_src: Path, out: Path, warm_reviews: int) -> dict[str, Any]:
    env = dict(os.environ)
    if side == "old":
        env["PYTHONPATH"] = f"{old_src}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    load = os.getloadavg()[0]
    cmd = [sys.executable, str(HERE / "admission_load.py"), *BENCH_ARGS]
    cmd += ["--concurrency", str(concurrency), "--waves", str(waves(concurrency, warm_reviews))]
    cmd += ["--out", str(out)]
    print("+ " + " ".join(cmd), f"({side})", flush=True)
    rc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False).returncode
    row: dict[str, Any] = {"loadavg_1_before": round(load, 2), "rc": rc}
    if out.is_file():
        run = json.loads(out.read_text())
        warm = run[f"warm_cache_{concurrency}_concurrent"]
        row |= {k: warm[k] for k in ("count", "p50_ms", "p99_ms", "reviews_per_second", "errors")}
        row |= warm.get("spent", {})
        row["server_client_ca"] = run.get("server_client_ca")
    return row


def summarise(rows: dict[str, list[dict[str, Any]]], concurrency: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in concurrency:
        old = [r for r in rows[f"old_{c}"] if "p99_ms" in r]
        new = [r for r in rows[f"new_{c}"] if "p99_ms" in r]
        if not old or not new:
            out[f"{c}_concurrent"] = {"missing": True}
            continue
        p99_old = statistics.median(r["p99_ms"] for r in old)
        p99_new = statistics.median(r["p99_ms"] for r in new)
        out[f"{c}_concurrent"] = {
            "runs_each": min(len(old), len(new)),
            "p99_ms_median_old": round(p99_old, 2),
            "p99_ms_median_new": round(p99_new, 2),
            "change": f"{(p99_new - p99_old) / p99_old:+.0%}",
            "rps_median_old": round(statistics.median(r["reviews_per_second"] for r in old), 1),
            "rps_median_new": round(statistics.median(r["reviews_per_second"] for r in new), 1),
            "errors": sum(r["errors"] for r in old + new),
        }
        for measure in SPENT:
            if all(measure in r for r in old + new):
                mine = statistics.median(r[measure] for r in new)
                theirs = statistics.median(r[measure] for r in old)
                out[f"{c}_concurrent"][measure] = {
                    "median_old": round(theirs, 4),
                    "median_new": round(mine, 4),
                    "change": f"{(mine - theirs) / theirs:+.1%}" if theirs else None,
                    "spread_old": [min(r[measure] for r in old), max(r[measure] for r in old)],
                    "spread_new": [min(r[measure] for r in new), max(r[measure] for r in new)],
                }
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old-src", type=Path, required=True, help="the other revision's src directory")
    p.add_argument("--old-rev", required=True, help="its name, for the record")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", default="500,200,50")
    p.add_argument(
        "--warm-reviews",
        type=int,
        default=WARM_REVIEWS,
        help=f"warm reviews per run, in waves of the concurrency (default {WARM_REVIEWS:,}; 20 waves at least)",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--note", default="", help="what else ran on the host, for the record ('host')")
    a = p.parse_args()
    if not (a.old_src / "kernelbake").is_dir():
        sys.exit(f"admission_load_ab: {a.old_src} holds no kernelbake package (git archive REV src)")
    levels = [int(c) for c in a.concurrency.split(",")]
    new_rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, check=False
    ).stdout.strip()
    rows: dict[str, list[dict[str, Any]]] = {f"{s}_{c}": [] for s in ("old", "new") for c in levels}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kb-load-ab-") as tmp:
        for rnd in range(1, a.rounds + 1):
            order = ("old", "new") if rnd % 2 else ("new", "old")
            for c in levels:
                for side in order:
                    row = one_run(side, c, a.old_src, Path(tmp) / f"{side}-{c}-{rnd}.json", a.warm_reviews)
                    rows[f"{side}_{c}"].append({"round": rnd, **row})
                    print(json.dumps({"side": side, "concurrency": c, **rows[f"{side}_{c}"][-1]}), flush=True)
    previous = json.loads(a.out.read_text()) if a.out.is_file() else None
    doc = {
        "bench": "admission_load A/B",
        "command": "bench/admission_load_ab.py --old-src DIR --old-rev "
        f"{a.old_rev} --rounds {a.rounds} --concurrency {a.concurrency} --warm-reviews {a.warm_reviews}",
        "each_run": "bench/admission_load.py " + " ".join(BENCH_ARGS) + " --concurrency C --waves W",
        "waves": {str(c): waves(c, a.warm_reviews) for c in levels},
        "old": a.old_rev,
        "new": new_rev,
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        **({"host": a.note} if a.note else {}),
        "seconds": round(time.monotonic() - started, 1),
        "rows": rows,
        "summary": summarise(rows, levels),
    }
    if previous is not None:
        doc["previous"] = {k: previous.get(k) for k in ("date", "host", "command", "summary")}
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
