"""The admission webhook's CPU time per warm review, this tree against other revisions: a
measure of the server's own work that a loaded host changes far less than latency.

bench/admission_load.py's latency A/B (bench/results/admission_load_ab.json) was inconclusive on
a shared 2-core host (single runs spread 2 to 5 times with the load), with the new code slower at
500 concurrent in both rounds. Here each side serves the same fixed stream: ``--reviews`` warm reviews
in waves of ``C`` at once (admission_load's mix of eight shapes, on ``C`` kept-alive TLS
connections opened one by one, the caches warmed first) at each concurrency, and what is
recorded is the CPU time (user + system, from /proc) the server's processes spent over the
waves, per review, and their context switches. The sides alternate, ``--rounds`` times, each
side's median kept. Latency and throughput are recorded beside it, for reading only.

The other side is ``git archive REV src`` run with the same virtual environment (PYTHONPATH
first); whether it takes ``--client-ca`` is asked from its own ``--help``. Both sides run
``--workers`` processes (deployed: 2) and are offered the API server's client certificate.
With several revisions (``--against A,B,C``, oldest first), each is a side, and ``steps`` lists
the medians in that order with this tree last, each with its change from the one before: where
along a history the work per review grew.

    .venv/bin/python bench/admission_cpu.py [--against d6fcc27[,REV...]] [--concurrency 50,200,500]
        [--reviews 10000] [--rounds 3] [--workers 2] [--out bench/results/admission_cpu.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from tests.admission import live  # noqa: E402
from tests.admission.live import client_tls  # noqa: E402
from tests.support.registry import running_registry  # noqa: E402

import admission_load as load  # noqa: E402 (bench/ is on the path from here)

RESULTS = REPO / "bench" / "results" / "admission_cpu.json"
# The server's instructions, counted only while ``measure`` turns instrumentation on.
CALLGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=no"]


def switches(pids: Sequence[int]) -> dict[str, int]:
    out = {"voluntary": 0, "involuntary": 0}
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches:"):
                out["voluntary"] += int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                out["involuntary"] += int(line.split()[1])
    return out


@contextlib.contextmanager
def side_server(
    src: Path, policy: Path, certs: Path, workers: int, log: Path, wrap: Sequence[str] = ()
) -> Iterator[tuple[int, int]]:
    """``kernelbake admission`` from ``src`` on 127.0.0.1 (run by ``wrap``); yields (port, pid)
    once every worker runs. The API server's client CA is passed where that side takes one."""
    # One hash seed for both sides: dict and set layouts, and so the work, the same run to run.
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    helped = subprocess.run(
        [*live.KERNELBAKE, "admission", "--help"], capture_output=True, text=True, env=env, check=True
    ).stdout
    clients = ["--client-ca", str(certs / "ca.crt")] if "--client-ca" in helped else []
    argv = [
        *wrap,
        *live.KERNELBAKE,
        "admission",
        "--policy",
        str(policy),
        "--tls-cert",
        str(certs / "tls.crt"),
        "--tls-key",
        str(certs / "tls.key"),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--workers",
        str(workers),
        "--log-level",
        "warning",
        *clients,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stderr=out, stdout=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 600
        while True:
            found = re.search(r"listening on https://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
            if found and (workers == 1 or len(load.tree(proc.pid)) > workers):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server from {src} did not start:\n{log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield int(found.group(1)), proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


async def measure(
    port: int,
    pid: int,
    certs: Path,
    mix: list[Any],
    concurrency: int,
    waves: int,
    counted: Path | None = None,
) -> dict[str, Any]:
    """The waves' figures; with ``counted`` (the server runs under callgrind, instrumenting
    nothing yet), the instructions it ran over the waves alone, dumped there."""
    tls = client_tls(certs)
    clients = [await load.Client.open(port, tls) for _ in range(concurrency)]
    try:
        await load.warm_up(clients, mix)
        pids = load.tree(pid)
        if counted is not None:
            _callgrind("--instr=on", pid)
            _callgrind("--zero", pid)
        cpu, ctx, started = load.cpu_seconds(pids), switches(pids), time.perf_counter()
        warm = await load.warm_waves(clients, mix, waves)
        wall = time.perf_counter() - started
        cpu, after = load.cpu_seconds(pids) - cpu, switches(pids)
        if counted is not None:
            _callgrind("--dump=waves", pid)
            _callgrind("--instr=off", pid)
    finally:
        for c in clients:
            c.close()
    reviews = concurrency * waves
    instructions = (
        {} if counted is None else {"instructions_per_review": round(_dumped(counted, pid) / reviews)}
    )
    return {
        **instructions,
        "reviews": reviews,
        "server_cpu_seconds": round(cpu, 3),
        "server_cpu_ms_per_review": round(1000 * cpu / reviews, 4),
        "context_switches_per_review": {k: round((after[k] - ctx[k]) / reviews, 3) for k in ctx},
        "wall_seconds": round(wall, 2),
        "p50_ms": warm["p50_ms"],
        "p99_ms": warm["p99_ms"],
        "errors": warm["errors"],
        "loadavg_1": round(os.getloadavg()[0], 2),
    }


def _callgrind(option: str, pid: int) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


def _dumped(out: Path, pid: int) -> int:
    """The instructions (Ir) in callgrind's dump of the waves (``--dump=waves``), which is then
    moved aside (``.read``), so that the next waves' dump is the one found."""
    for dump in sorted(out.parent.glob(f"{out.name}.{pid}.*[0-9]")):
        text = dump.read_text(errors="replace")
        found = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
        if found and re.search(r"^desc: Trigger: .*\bwaves$", text, re.MULTILINE):
            dump.rename(dump.with_name(dump.name + ".read"))
            return int(found.group(1))
    raise RuntimeError(f"no callgrind dump of the waves beside {out}")


def other_tree(rev: str, into: Path) -> Path:
    """``src`` of ``rev``, unpacked under ``into``."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    sides = {"this": REPO / "src"}
    sides |= {rev: other_tree(rev, work / f"other-{rev}") for rev in args.against}
    rows: dict[str, dict[int, list[dict[str, Any]]]] = {s: {c: [] for c in args.concurrency} for s in sides}
    with running_registry(work / "registry") as registry:
        certs = work / "certs"
        subprocess.run(
            [str(REPO / "deploy/make-cert.sh"), "--out", str(certs), "--ip", "127.0.0.1"],
            check=True,
            capture_output=True,
        )
        key, pub = live.generate_key(work / "keys", "bench")
        h100 = live.push_target(registry, load.REPOSITORY, "h100", "h100", work / "h100")
        live.sign(h100, key)
        unsigned = live.push_target(registry, load.REPOSITORY, "unsigned", "h100", work / "unsigned")
        policy = live.write_policy(work / "policy.yaml", [f"{registry}/kernelbake/**"], pub)
        mix = load.workload(registry, h100, unsigned)
        for round_ in range(args.rounds):
            # Alternating which side goes first, so that neither always meets the host's same moment.
            order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
            for name in order:
                dumps = args.callgrind_dir or work
                counted = dumps / f"callgrind-{name}-{round_}" if args.callgrind else None
                wrap = () if counted is None else [*CALLGRIND, f"--callgrind-out-file={counted}.%p"]
                log = work / f"{name}.log"
                with side_server(sides[name], policy, certs, args.workers, log, wrap) as (port, pid):
                    for c in args.concurrency:
                        waves = max(1, args.reviews // c)
                        row = asyncio.run(measure(port, pid, certs, mix, c, waves, counted))
                        rows[name][c].append({"round": round_ + 1, **row})
                        print(json.dumps({"side": name, "concurrency": c, **row}), file=sys.stderr)
    measured: dict[str, Any] = {"runs": {s: {str(c): r for c, r in by.items()} for s, by in rows.items()}}
    if len(args.against) == 1:
        measured["summary"] = summary(rows, args.against[0])
    else:
        measured["summary"] = {rev: summary(rows, rev) for rev in args.against}
        measured["steps"] = steps(rows, [*args.against, "this"])
    return measured


def _measures(rows: dict[str, dict[int, list[dict[str, Any]]]]) -> list[str]:
    measures = ["server_cpu_ms_per_review"]
    if all("instructions_per_review" in r for by in rows.values() for rs in by.values() for r in rs):
        measures.insert(0, "instructions_per_review")
    return measures


def steps(rows: dict[str, dict[int, list[dict[str, Any]]]], order: list[str]) -> dict[str, Any]:
    """Per concurrency and measure, each side's median in ``order``, with its change from the
    side before it."""
    out: dict[str, Any] = {}
    for c in rows["this"]:
        for measure in _measures(rows):
            medians = [statistics.median(r[measure] for r in rows[side][c]) for side in order]
            out.setdefault(f"{c}_concurrent", {})[measure] = [
                {
                    "side": side,
                    "median": round(m, 4),
                    "change": None if i == 0 else f"{100 * (m - medians[i - 1]) / medians[i - 1]:+.1f}%",
                }
                for i, (side, m) in enumerate(zip(order, medians, strict=True))
            ]
    return out


def summary(rows: dict[str, dict[int, list[dict[str, Any]]]], against: str) -> dict[str, Any]:
    """Per concurrency, this tree's and ``against``'s median of each measure, the change and the spread."""
    this, other = rows["this"], rows[against]
    measures = _measures({"this": this, against: other})
    out: dict[str, Any] = {}
    for c in this:
        out[f"{c}_concurrent"] = {"errors": sum(r["errors"] for r in [*this[c], *other[c]])}
        for measure in measures:
            mine = statistics.median(r[measure] for r in this[c])
            theirs = statistics.median(r[measure] for r in other[c])
            out[f"{c}_concurrent"][measure] = {
                "median_other": round(theirs, 4),
                "median_this": round(mine, 4),
                "change": f"{100 * (mine - theirs) / theirs:+.1f}%",
                "spread_other": [min(r[measure] for r in other[c]), max(r[measure] for r in other[c])],
                "spread_this": [min(r[measure] for r in this[c]), max(r[measure] for r in this[c])],
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--against",
        type=lambda s: s.split(","),
        default=["d6fcc27"],
        help="the other sides' revisions, comma-separated, oldest first (default d6fcc27)",
    )
    parser.add_argument(
        "--concurrency",
        type=lambda s: [int(v) for v in s.split(",")],
        default=[50, 200, 500],
        help="concurrent reviews per wave, comma-separated (default 50,200,500)",
    )
    parser.add_argument(
        "--reviews", type=int, default=10_000, help="reviews per concurrency, in waves of it (default 10,000)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two sides (default 3)")
    parser.add_argument("--workers", type=int, default=2, help="kernelbake admission --workers (deployed: 2)")
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="also count the server's instructions per review under valgrind's callgrind "
        "(--workers 1: one process to count; slower by some 50 times while counting)",
    )
    parser.add_argument(
        "--callgrind-dir",
        type=Path,
        help="keep callgrind's dumps here (callgrind-SIDE-ROUND.PID.N.read, one per concurrency, "
        "for callgrind_annotate); default: dropped with the run's temporary directory",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.callgrind_dir:
        args.callgrind = True
        args.callgrind_dir.mkdir(parents=True, exist_ok=True)
    if args.callgrind:
        args.workers = 1
    load_before = os.getloadavg()
    started = time.monotonic()
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    with tempfile.TemporaryDirectory(prefix="kb-admission-cpu-") as tmp:
        measured = run(args, Path(tmp))
    report = {
        "bench": "admission_cpu",
        "command": "bench/admission_cpu.py " + " ".join(sys.argv[1:]),
        "this": f"the working tree at {head.stdout.strip()}",
        "other": args.against[0] if len(args.against) == 1 else args.against,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_1_5_15_before": [round(v, 2) for v in load_before],
            "loadavg_1_5_15_after": [round(v, 2) for v in os.getloadavg()],
        },
        "how": "server CPU (user + system of the parent and its workers, /proc) over the waves, per "
        "review; load generator on the same host",
        "seconds": round(time.monotonic() - started, 1),
        **measured,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
