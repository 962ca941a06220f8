"""Connection patterns for bench/admission_adversarial.py (issue 41, items 1 and 2): the rows
that attack the webhook with connections rather than with bodies, run against the same server
under the same enforced 512 MiB cgroup.

- **churn**: ``CHURN_PROCESSES`` processes of ``CHURN_THREADS`` threads connect, half-close and
  reconnect for ``CHURN_SECONDS`` (issue 41: 181,669 such loops in 40 s took each worker from 45
  to ~250 MiB, the cgroup to 506 MiB, and it stayed there); then quiet until every worker is back within ``BASELINE_SLACK_MIB`` of its RSS before
  (``SETTLE_SECONDS`` at most), and one review of the bench's ``containers`` shape at ``AFTER_CHURN_BYTES`` to every worker at
  in turn (the 6.6 MB review that OOM-killed a worker then). Recorded: each process's RSS before,
  at its peak during the churn and after the quiet; the cgroup's usage the same way; the
  review's answers.
- **held connections**: a process holds ``HELD`` TLS connections (one fewer than the two
  workers' places, as in issue 41), each sending a tiny request every ``REFRESH_SECONDS`` and
  reconnecting at once when it is cut; it shows the API server's client certificate (the webhook
  runs with ``--client-ca``), standing for the worst holder: one past the handshake, as anyone
  is under ``--unsafe-any-client``; meanwhile, for ``HOLD_SECONDS``, a review on a new
  connection every ``FRESH_EVERY`` seconds (as the API server opens one when its pool is short)
  and a probe on a new connection every ``PROBE_EVERY`` seconds, as the kubelet sends them, on
  the probes' port and, for comparison, on the webhook's (issue 41: 831 of 831 such reviews and
  421 of 421 ``/healthz`` probes failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import multiprocessing
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

CHURN_SECONDS = 40.0
CHURN_PROCESSES = 2
CHURN_THREADS = 4
SETTLE_SECONDS = 30.0
AFTER_CHURN_BYTES = 6_600_000
# A worker back within this of its RSS before the churn counts as back at its baseline.
BASELINE_SLACK_MIB = 32
HELD = 1023
HOLD_SECONDS = 30.0
REFRESH_SECONDS = 5.0
FRESH_EVERY = 0.2
PROBE_EVERY = 0.5


def api_server_tls(cafile: str, *, client: bool = True) -> ssl.SSLContext:
    """A client's TLS context as the API server's: it trusts the webhook's CA ``cafile`` and
    shows the client certificate make-cert.sh wrote beside it (the webhook runs with
    ``--client-ca``, as deployed); ``client=False``: no certificate."""
    tls = ssl.create_default_context(cafile=cafile)
    if client:
        certs = Path(cafile).parent
        tls.load_cert_chain(certs / "client.crt", certs / "client.key")
    return tls


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cgroup_usage(path: Path | None, version: int | None) -> int | None:
    """What the cgroup holds against its limit now (None where it could not be made)."""
    if path is None:
        return None
    name = "memory.current" if version == 2 else "memory.usage_in_bytes"
    return int((path / name).read_text())


class Peaks:
    """Each process's RSS and the cgroup's usage every 50 ms, their peaks kept."""

    def __init__(self, pids: Sequence[int], cgroup: Callable[[], int | None]) -> None:
        self.pids, self.cgroup = pids, cgroup
        self.rss_kib = dict.fromkeys(pids, 0)
        self.cgroup_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self.pids:
                with contextlib.suppress(OSError):
                    self.rss_kib[pid] = max(self.rss_kib[pid], _rss_kib(pid))
            with contextlib.suppress(OSError):
                self.cgroup_bytes = max(self.cgroup_bytes, self.cgroup() or 0)
            self._stop.wait(0.05)

    def __enter__(self) -> Peaks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def churner(port: int, seconds: float, threads: int, conn: Connection) -> None:
    """Connect, half-close, close and again, from ``threads`` threads for ``seconds``; sends
    back the number of connections made."""
    stop = time.monotonic() + seconds
    made = [0] * threads

    def loop(index: int) -> None:
        while time.monotonic() < stop:
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                continue
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            sock.close()
            made[index] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    conn.send(sum(made))


def churn_row(
    server: Any, pids: Sequence[int], cgroup: Callable[[], int | None], review: Callable[[], dict[str, Any]]
) -> tuple[dict[str, Any], float, float]:
    """The churn, the quiet, then ``review()`` (the 6.6 MB review to every worker at once)."""
    mp = multiprocessing.get_context("spawn")
    before = {pid: _rss_kib(pid) for pid in pids}
    cgroup_before = cgroup()
    start = time.monotonic()
    with Peaks(pids, cgroup) as peaks:
        pipes = [mp.Pipe() for _ in range(CHURN_PROCESSES)]
        procs = [
            mp.Process(target=churner, args=(server.port, CHURN_SECONDS, CHURN_THREADS, theirs), daemon=True)
            for _, theirs in pipes
        ]
        for p in procs:
            p.start()
        made = sum(ours.recv() for ours, _ in pipes)
        for p in procs:
            p.join(30)
    churned = time.monotonic()
    # The server works through the connections queued when the churn stopped: wait until each
    # worker is back within BASELINE_SLACK_MIB of where it started, SETTLE_SECONDS at most.
    while time.monotonic() - churned < SETTLE_SECONDS:
        time.sleep(0.5)
        if all(_rss_kib(pid) - before[pid] <= BASELINE_SLACK_MIB * 1024 for pid in pids):
            break
    settled = time.monotonic() - churned
    after = {pid: _rss_kib(pid) for pid in pids}
    cgroup_after = cgroup()
    # The kept-alive connections idle during the churn may have given their places up to it
    # (the API server opens new ones the same way).
    server.reconnect(1)
    answers = review()
    end = time.monotonic()
    entry = {
        "shape": "connection_churn_then_a_6_6_mb_review",
        "item": f"connect / half-close / reconnect loops for {CHURN_SECONDS:g} s from "
        f"{CHURN_PROCESSES} x {CHURN_THREADS} threads, quiet until the workers are back (at most "
        f"{SETTLE_SECONDS:g} s), then one "
        f"review of about {AFTER_CHURN_BYTES:,} bytes to each worker in turn",
        "items": made,
        "connections_per_second": round(made / (churned - start)),
        "seconds_until_back_within_slack": round(settled, 1),
        "baseline_slack_mib": BASELINE_SLACK_MIB,
        "processes_rss_kib": {
            str(pid): {
                "before": before[pid],
                "peak_during_churn": peaks.rss_kib[pid],
                "after_quiet": after[pid],
            }
            for pid in pids
        },
        "cgroup_usage_bytes": {
            "before": cgroup_before,
            "peak_during_churn": peaks.cgroup_bytes if cgroup_before is not None else None,
            "after_quiet": cgroup_after,
        },
        **answers,
    }
    return entry, start, end


async def _hold(port: int, cafile: str, n: int, seconds: float, refresh: float, conn: Connection) -> None:
    tls = api_server_tls(cafile)
    # The hold's clock starts once every connection had its first answer (or 30 s passed).
    ends = [float("inf")]
    counts = {"connects": 0, "connect_failures": 0, "requests": 0, "cut": 0}
    opened = asyncio.Event()
    first_round = [0]

    async def one() -> None:
        first = True
        while time.monotonic() < ends[0]:
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=tls, server_hostname="127.0.0.1"
                )
            except (OSError, ssl.SSLError):
                counts["connect_failures"] += 1
                await asyncio.sleep(0.5)
                continue
            counts["connects"] += 1
            try:
                while time.monotonic() < ends[0]:
                    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    await reader.readexactly(length)
                    counts["requests"] += 1
                    if first:
                        first = False
                        first_round[0] += 1
                        if first_round[0] == n:
                            opened.set()
                    await asyncio.sleep(refresh)
            except (OSError, ssl.SSLError, asyncio.IncompleteReadError, IndexError, ValueError):
                counts["cut"] += 1
            finally:
                writer.transport.abort()

    tasks = []
    for _ in range(n):
        tasks.append(asyncio.create_task(one()))
        # Opened a few at a time, as a client holding connections would.
        await asyncio.sleep(0.002)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(opened.wait(), 30)
    ends[0] = time.monotonic() + seconds
    conn.send({"ready": first_round[0]})
    await asyncio.gather(*tasks)
    conn.send(counts)


def holder(port: int, cafile: str, n: int, seconds: float, refresh: float, conn: Connection) -> None:
    asyncio.run(_hold(port, cafile, n, seconds, refresh, conn))


def _fresh_review(port: int, cafile: str, body: bytes) -> tuple[int | None, float]:
    started = time.monotonic()
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=api_server_tls(cafile), timeout=10)
    try:
        conn.request("POST", "/validate?timeout=10s", body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    except (OSError, http.client.HTTPException):
        return None, time.monotonic() - started
    finally:
        conn.close()


def _fresh_probe(port: int, cafile: str | None) -> tuple[int | None, float]:
    started = time.monotonic()
    if cafile is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=api_server_tls(cafile), timeout=2)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    except (OSError, http.client.HTTPException):
        return None, time.monotonic() - started
    finally:
        conn.close()


def _summary(results: Sequence[tuple[int | None, float]]) -> dict[str, Any]:
    ok = sorted(seconds * 1000 for status, seconds in results if status == 200)
    out: dict[str, Any] = {"sent": len(results), "answered_200": len(ok), "failed": len(results) - len(ok)}
    if ok:
        out |= {
            "p50_ms": round(ok[len(ok) // 2], 1),
            "p99_ms": round(ok[min(len(ok) - 1, round(0.99 * (len(ok) - 1)))], 1),
            "max_ms": round(ok[-1], 1),
        }
    return out


def held_row(server: Any, probe_port: int, body: bytes) -> tuple[dict[str, Any], float, float]:
    """``HELD`` connections held; fresh reviews and fresh probes meanwhile."""
    mp = multiprocessing.get_context("spawn")
    ours, theirs = mp.Pipe()
    start = time.monotonic()
    proc = mp.Process(
        target=holder,
        args=(server.port, server.cafile, HELD, HOLD_SECONDS, REFRESH_SECONDS, theirs),
        daemon=True,
    )
    proc.start()
    ready = ours.recv()
    reviews: list[tuple[int | None, float]] = []
    probes: list[tuple[int | None, float]] = []
    probes_on_webhook_port: list[tuple[int | None, float]] = []
    stop = threading.Event()

    def every(seconds: float, call: Callable[[], tuple[int | None, float]], into: list[Any]) -> None:
        while not stop.is_set():
            began = time.monotonic()
            into.append(call())
            stop.wait(max(0.0, began + seconds - time.monotonic()))

    loops = [
        threading.Thread(
            target=every, args=(FRESH_EVERY, lambda: _fresh_review(server.port, server.cafile, body), reviews)
        ),
        threading.Thread(target=every, args=(PROBE_EVERY, lambda: _fresh_probe(probe_port, None), probes)),
        threading.Thread(
            target=every,
            args=(PROBE_EVERY, lambda: _fresh_probe(server.port, server.cafile), probes_on_webhook_port),
        ),
    ]
    for t in loops:
        t.start()
    counts = ours.recv()
    stop.set()
    for t in loops:
        t.join(30)
    proc.join(30)
    end = time.monotonic()
    server.reconnect(1)
    entry = {
        "shape": "held_connections",
        "item": f"{HELD} TLS connections, each a GET /healthz every {REFRESH_SECONDS:g} s and reconnecting "
        f"when cut, for {HOLD_SECONDS:g} s; a review on a new connection every {FRESH_EVERY:g} s and "
        f"a probe on a new connection every {PROBE_EVERY:g} s",
        "items": HELD,
        "holders_answered_at_first": ready["ready"],
        "holder": counts,
        "body_bytes": len(body),
        "fresh_connection_reviews": _summary(reviews),
        "fresh_probes_on_the_probes_port": _summary(probes),
        "fresh_probes_on_the_webhooks_port": _summary(probes_on_webhook_port),
    }
    return entry, start, end


def targets(rows: Sequence[dict[str, Any]]) -> dict[str, bool]:
    churn = next(r for r in rows if r["shape"] == "connection_churn_then_a_6_6_mb_review")
    held = next(r for r in rows if r["shape"] == "held_connections")
    rss = churn["processes_rss_kib"].values()
    return {
        "churn_memory_back_at_baseline": all(
            p["after_quiet"] - p["before"] <= BASELINE_SLACK_MIB * 1024 for p in rss
        ),
        "review_after_churn_answered": all(a.get("http") == 200 for a in churn["answers"]),
        "held_fresh_reviews_answered": held["fresh_connection_reviews"]["failed"] == 0,
        "held_probes_answered": held["fresh_probes_on_the_probes_port"]["failed"] == 0,
    }


def dumps(entry: dict[str, Any]) -> str:
    return json.dumps({k: entry[k] for k in ("shape", "items")})
