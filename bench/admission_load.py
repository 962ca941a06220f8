"""Load on the admission webhook, with the real parts: ``kernelbake admission`` as a process
serving HTTPS (CA from deploy/make-cert.sh), images in a local docker-registry signed by
``kernelbake sign``, AdmissionReview documents as the API server sends them.

Measures, and writes bench/results/admission_load.json:
- first review of a new digest (tag resolution + full verification against the registry);
- waves of 200 concurrent reviews against a warm cache, over 200 kept-alive TLS connections
  (the API server pools its connections the same way): latency percentiles and errors;
- the server's resident memory over 10,000 reviews (a mix of admitted, denied, malformed);
- a slow registry burst: 250 reviews of new digests on a second registry behind a proxy that
  drips its answers (one byte every 0.2 s), sent at once from another process, while the same
  waves of 200 warm reviews (for 30 s from the burst on) and first reviews of new digests go on
  against the healthy registry; and, as the control, the same 30 s without the burst.

Targets (the issues'): 0 errors, p99 ≤ 50 ms warm; first review ≤ 500 ms; memory flat; during
the burst, the healthy registry's reviews the same: warm p99 ≤ 50 ms, first reviews ≤ 500 ms,
0 errors, while every review of the slow registry is a 503 denial within the deadline.

    .venv/bin/python bench/admission_load.py [--waves 20] [--concurrency 200] [--reviews 10000] [--fresh 20] [--burst 250] [--workers N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import json
import multiprocessing
import os
import platform
import socket
import ssl
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, ClassVar

REPO = Path(__file__).resolve().parents[1]
# The bench reuses the test harness's real parts (registry, image pusher, server runner).
sys.path.insert(0, str(REPO))

from tests.admission import documents, live  # noqa: E402
from tests.admission.live import client_tls  # noqa: E402
from tests.support.registry import running_registry  # noqa: E402

RESULTS = REPO / "bench" / "results" / "admission_load.json"
CONCURRENCY = 200
REPOSITORY = "kernelbake/qwen3-0.6b"
DRIP_SECONDS = 0.2


class Client(asyncio.Protocol):
    """One kept-alive HTTPS connection speaking just enough HTTP/1.1, as a protocol (no
    streams), so that the load generator's own overhead stays small next to the server's.

    The class counts this process's connections: each one opened is a full TLS handshake
    (asyncio's client is given no session to resume; ``resumed`` counts any that were), and one
    that ends without ``close`` was closed by the server. A server that closes or cuts kept-alive
    connections would show there, and in errors: a connection is not opened again."""

    opened: ClassVar[int] = 0
    resumed: ClassVar[int] = 0
    closed_by_server: ClassVar[int] = 0

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[float, int, bytes]] | None = None
        self.started = 0.0
        self.closing = False

    @classmethod
    async def open(cls, port: int, tls: ssl.SSLContext) -> Client:
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(cls, "127.0.0.1", port, ssl=tls)
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        Client.opened += 1
        tls = transport.get_extra_info("ssl_object")
        Client.resumed += tls is not None and tls.session_reused

    def connection_lost(self, exc: Exception | None) -> None:
        Client.closed_by_server += not self.closing
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc!r}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(self.buf[:end])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(self.buf) < end + 4 + length:
            return
        elapsed = time.perf_counter() - self.started
        payload = bytes(self.buf[end + 4 : end + 4 + length])
        del self.buf[: end + 4 + length]
        self.waiter.set_result((elapsed, int(head.split(b" ", 2)[1]), payload))

    async def post(self, path: str, body: bytes) -> tuple[float, int, bytes]:
        assert self.transport is not None
        head = f"POST {path}?timeout=10s HTTP/1.1\r\nHost: kernelbake-admission\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self.waiter = asyncio.get_running_loop().create_future()
        self.started = time.perf_counter()
        self.transport.write(head.encode() + body)
        try:
            return await self.waiter
        finally:
            self.waiter = None

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()


@contextlib.contextmanager
def drip_proxy(upstream: str, drip: float) -> Iterator[str]:
    """``127.0.0.1:<port>`` in front of ``upstream``: requests go through at once, answers come
    back one byte every ``drip`` seconds (a registry that is up, but slow past any read
    timeout). Its threads stop when the block ends."""
    host, _, port = upstream.rpartition(":")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    opened: list[socket.socket] = []

    def up(client: socket.socket, server: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                server.sendall(data)

    def down(server: socket.socket, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set() and (byte := server.recv(1)):
                client.sendall(byte)
                stop.wait(drip)
        with contextlib.suppress(OSError):
            client.shutdown(socket.SHUT_RDWR)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection((host, int(port)))
            opened.extend((client, server))
            for target, args in ((up, (client, server)), (down, (server, client))):
                threading.Thread(target=target, args=args, daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        acceptor.join(5)
        listener.close()
        for sock in opened:
            with contextlib.suppress(OSError):
                sock.close()


Check = Callable[[dict[str, Any]], bool]


def review(doc: dict[str, Any]) -> dict[str, Any]:
    doc["request"]["uid"] = str(uuid.uuid4())
    return doc


def workload(
    registry: str, h100: Any, unsigned: Any
) -> list[tuple[str, Callable[[], dict[str, Any]], Check]]:
    """(path, document factory, check of the response) for the mix of reviews."""
    tag, pinned = h100.tagged, h100.pinned

    def allowed_with_patch(r: dict[str, Any]) -> bool:
        return r["allowed"] is True and r.get("patchType") == "JSONPatch"

    def allowed_plain(r: dict[str, Any]) -> bool:
        return r["allowed"] is True and "patch" not in r

    def denied(code: int) -> Check:
        return lambda r: r["allowed"] is False and r["status"]["code"] == code

    return [
        ("/mutate", lambda: review(documents.load("pod-create", tag)), allowed_with_patch),
        ("/mutate", lambda: review(documents.load("deployment-create", tag)), allowed_with_patch),
        ("/validate", lambda: review(documents.load("pod-create", pinned)), allowed_plain),
        (
            "/mutate",
            lambda: review(documents.as_update(documents.load("pod-create", pinned), old_image=tag)),
            allowed_plain,
        ),
        (
            "/mutate",
            lambda: review(
                documents.schedule(
                    documents.load("pod-create", tag), node_selector={"nvidia.com/gpu.product": "NVIDIA-L4"}
                )
            ),
            denied(403),
        ),
        ("/validate", lambda: review(documents.load("pod-create", unsigned.tagged)), denied(403)),
        ("/mutate", lambda: review(documents.load("pod-create", f"{registry}/{REPOSITORY}")), denied(403)),
        (
            "/mutate",
            lambda: {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": str(uuid.uuid4())},
            },
            denied(400),
        ),
    ]


TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the server's workers)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(p for child in children for p in tree(int(child)))]


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system time of ``pids``, from /proc/PID/stat (fields 14 and 15)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def established(pids: Sequence[int], port: int) -> list[int]:
    """For each of ``pids``, its established TCP connections on local ``port`` (/proc: the
    sockets among its open files, matched in /proc/net/tcp); the kernel spreads connections
    over the workers' SO_REUSEPORT sockets by a hash, so not always evenly."""
    ours: dict[str, int] = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            ours[fields[9]] = port
    counts = []
    for pid in pids:
        held = 0
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = str(fd.readlink())
                    held += link.startswith("socket:[") and link[8:-1] in ours
        counts.append(held)
    return counts


def rss_kib(pid: int) -> int:
    """Resident memory of ``pid`` and its children (the workers, with --workers > 1)."""
    total = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total += int(line.split()[1])
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return total + sum(rss_kib(int(child)) for child in children)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(latencies: list[float]) -> dict[str, float]:
    if not latencies:
        return {"count": 0}
    ms = [v * 1000 for v in latencies]
    return {
        "count": len(ms),
        "p50_ms": round(percentile(ms, 0.50), 2),
        "p90_ms": round(percentile(ms, 0.90), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "max_ms": round(max(ms), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }


def judge_answer(doc: dict[str, Any], status: int, payload: bytes, check: Check) -> str | None:
    if status != 200:
        return f"HTTP {status}: {payload[:200]!r}"
    response = json.loads(payload).get("response", {})
    if response.get("uid") != doc["request"]["uid"]:
        return "uid not echoed"
    if not check(response):
        return f"unexpected answer: {json.dumps(response)[:300]}"
    return None


async def timed(client: Client, path: str, body: bytes) -> tuple[float, int, bytes]:
    try:
        return await client.post(path, body)
    except (OSError, asyncio.IncompleteReadError) as exc:
        return 0.0, 0, repr(exc).encode()


async def one(client: Client, path: str, doc: dict[str, Any], check: Check) -> tuple[float, str | None]:
    elapsed, status, payload = await timed(client, path, json.dumps(doc).encode())
    return elapsed, judge_answer(doc, status, payload, check)


async def wave(clients: list[Client], mix: list[Any], n: int) -> tuple[list[float], list[str]]:
    """One wave of concurrent warm reviews, one per client; bodies ready before, checks after."""
    batch = []
    for i in range(len(clients)):
        path, make, check = mix[(n + i) % len(mix)]
        doc = make()
        batch.append((path, doc, json.dumps(doc).encode(), check))
    answers = await asyncio.gather(
        *(timed(client, path, body) for client, (path, _, body, _) in zip(clients, batch, strict=True))
    )
    latencies, errors = [], []
    for (_, doc, _, check), (elapsed, status, payload) in zip(batch, answers, strict=True):
        latencies.append(elapsed)
        error = judge_answer(doc, status, payload, check)
        if error:
            errors.append(error)
    return latencies, errors


def burst_sender(port: int, cafile: str, slow: str, count: int, conn: Connection) -> None:
    """The burst, from a process of its own (as the API server is one): ``count`` connections,
    then, on "go", one review of a new digest on each, all at once; sends back the answers."""

    async def send() -> tuple[list[tuple[float, int, bytes]], float]:
        tls = client_tls(Path(cafile).parent)
        clients = [await Client.open(port, tls) for _ in range(count)]
        bodies = [
            json.dumps(
                review(
                    documents.load(
                        "pod-create",
                        f"{slow}/{REPOSITORY}@sha256:{hashlib.sha256(b'burst-%d' % i).hexdigest()}",
                    )
                )
            ).encode()
            for i in range(count)
        ]
        conn.send("ready")
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(timed(c, "/validate", b) for c, b in zip(clients, bodies, strict=True))
        )
        seconds = time.perf_counter() - started
        for c in clients:
            c.close()
        return answers, seconds

    conn.send(asyncio.run(send()))


async def healthy_window(
    clients: list[Client],
    mix: list[Any],
    probe: Client,
    fresh: list[Any],
    seconds: float,
    done: Callable[[], bool],
) -> dict[str, Any]:
    """Waves of warm reviews for ``seconds`` (and until ``done()``), with a first review of each
    new digest in ``fresh`` on ``probe`` every 0.3 s meanwhile, all on the healthy registry."""

    async def first_reviews() -> tuple[list[float], list[str]]:
        times, errors = [], []
        for image in fresh:
            await asyncio.sleep(0.3)
            doc = review(documents.load("pod-create", image.tagged))
            elapsed, error = await one(probe, "/mutate", doc, lambda r: r["allowed"] is True and "patch" in r)
            times.append(elapsed)
            if error:
                errors.append(error)
        return times, errors

    firsts = asyncio.ensure_future(first_reviews())
    warm: list[float] = []
    warm_errors: list[str] = []
    waves = 0
    ends = time.perf_counter() + seconds
    while not done() or not firsts.done() or time.perf_counter() < ends:
        latencies, errors = await wave(clients, mix, waves)
        warm += latencies
        warm_errors += errors
        waves += 1
    first_times, first_errors = await firsts
    return {
        "warm_200_concurrent": {
            **summary(warm),
            "window_seconds": seconds,
            "waves": waves,
            "errors": len(warm_errors),
            "error_samples": warm_errors[:3],
        },
        "first_review": {
            **summary(first_times),
            "errors": len(first_errors),
            "error_samples": first_errors[:3],
        },
    }


async def slow_registry_burst(
    args: argparse.Namespace,
    port: int,
    tls: ssl.SSLContext,
    cafile: Path,
    clients: list[Client],
    mix: list[Any],
    fresh: list[Any],
    slow: str,
) -> dict[str, Any]:
    """First the control: ``args.burst_window`` seconds of warm waves with first reviews of new
    digests on the healthy registry. Then the same again while ``args.burst`` reviews of new
    digests on the dripping registry arrive all at once, on their own connections from another
    process (as the API server opens more when reviews are slow); the window covers the burst's
    answers and the time after, while its verifications go on dripping."""
    loop = asyncio.get_running_loop()
    mp = multiprocessing.get_context("spawn")
    ours, theirs = mp.Pipe()
    sender = mp.Process(target=burst_sender, args=(port, str(cafile), slow, args.burst, theirs), daemon=True)
    sender.start()
    probe = await Client.open(port, tls)
    half = len(fresh) // 2
    try:
        control = await healthy_window(clients, mix, probe, fresh[:half], args.burst_window, lambda: True)
        if await loop.run_in_executor(None, ours.recv) != "ready":
            raise RuntimeError("the burst sender did not start")
        ours.send("go")
        during = await healthy_window(clients, mix, probe, fresh[half:], args.burst_window, ours.poll)
        answers, burst_seconds = ours.recv()
    finally:
        probe.close()
        sender.join(30)
    kinds = {"saturated": 0, "did_not_finish": 0, "other": 0}
    samples: list[str] = []
    burst_latencies = []
    for elapsed, status, payload in answers:
        burst_latencies.append(elapsed)
        response = json.loads(payload).get("response", {}) if status == 200 else {}
        message = response.get("status", {}).get("message", "")
        if response.get("allowed") is False and response["status"]["code"] == 503:
            kind = (
                "saturated"
                if "is saturated" in message
                else "did_not_finish"
                if "did not finish" in message
                else "other"
            )
        else:
            kind = "other"
        kinds[kind] += 1
        if kind == "other" and len(samples) < 3:
            samples.append(f"HTTP {status}: {payload[:300]!r}")
    return {
        "slow_registry": f"docker-registry behind a proxy sending answers one byte every {DRIP_SECONDS} s",
        "burst": {
            "reviews": args.burst,
            **summary(burst_latencies),
            "all_answered_after_seconds": round(burst_seconds, 2),
            "denied_503_saturated": kinds["saturated"],
            "denied_503_did_not_finish": kinds["did_not_finish"],
            "other": kinds["other"],
            "other_samples": samples,
        },
        "healthy_without_burst": control,
        "healthy_during_burst": during,
    }


async def first_reviews(client: Client, fresh: list[Any]) -> dict[str, Any]:
    """First review of a new digest: one at a time, tag and full verification."""
    first: list[float] = []
    first_errors = []
    for image in fresh:
        doc = review(documents.load("pod-create", image.tagged))
        elapsed, error = await one(client, "/mutate", doc, lambda r: r["allowed"] is True and "patch" in r)
        first.append(elapsed)
        if error:
            first_errors.append(error)
    return {**summary(first), "errors": len(first_errors), "error_samples": first_errors[:3]}


async def warm_up(clients: list[Client], mix: list[Any]) -> None:
    """Warm the caches: every shape on every connection (so on every worker), unmeasured."""
    for offset in range(len(mix)):
        shapes = [mix[(offset + i) % len(mix)] for i in range(len(clients))]
        warmup = [one(c, path, make(), check) for c, (path, make, check) in zip(clients, shapes, strict=True)]
        for _, error in await asyncio.gather(*warmup):
            if error:
                raise RuntimeError(f"warm-up review failed: {error}")


async def warm_waves(
    clients: list[Client], mix: list[Any], waves: int, server: tuple[int, int] | None = None
) -> dict[str, Any]:
    """Waves of ``len(clients)`` (--concurrency) concurrent reviews, all sent at once; with
    ``server`` (its pid and port), where the CPU time went (``spent``)."""
    warm: list[float] = []
    warm_errors: list[str] = []
    before = Spent.now(*server) if server is not None else None
    started = time.perf_counter()
    for n in range(waves):
        latencies, errors = await wave(clients, mix, n)
        warm += latencies
        warm_errors += errors
    wall = time.perf_counter() - started
    return {
        **summary(warm),
        "waves": waves,
        "concurrency": len(clients),
        "reviews_per_second": round(len(warm) / wall, 1),
        "errors": len(warm_errors),
        "error_samples": warm_errors[:3],
        **({} if before is None else {"spent": before.since(len(warm))}),
    }


@dataclasses.dataclass(frozen=True)
class Spent:
    """Clocks read at the start of a stretch of reviews: the server's CPU time (its processes),
    the load generator's own (this process: both share the host's cores, and a wave's wall time
    is the generator's work on it plus the server's), and this process's connections."""

    pids: tuple[int, ...]
    port: int
    wall: float
    server_cpu: tuple[float, ...]
    client_cpu: float
    opened: int
    closed_by_server: int

    @classmethod
    def now(cls, pid: int, port: int) -> Spent:
        pids = tuple(tree(pid))
        return cls(
            pids,
            port,
            time.perf_counter(),
            tuple(cpu_seconds([p]) for p in pids),
            time.process_time(),
            Client.opened,
            Client.closed_by_server,
        )

    def since(self, reviews: int) -> dict[str, Any]:
        wall = time.perf_counter() - self.wall
        by_process = [cpu_seconds([p]) - t for p, t in zip(self.pids, self.server_cpu, strict=True)]
        server = sum(by_process)
        client = time.process_time() - self.client_cpu
        per = 1000 / max(reviews, 1)
        return {
            "wall_seconds": round(wall, 3),
            "server_cpu_ms_per_review": round(server * per, 4),
            "client_cpu_ms_per_review": round(client * per, 4),
            # Of all the host's cores over the stretch: what the two together kept busy.
            "cpu_share_of_host": round((server + client) / wall / (os.cpu_count() or 1), 3),
            "connections_opened": Client.opened - self.opened,
            "connections_closed_by_server": Client.closed_by_server - self.closed_by_server,
            # The parent first, then each worker: how evenly the kernel spread the connections.
            "server_cpu_seconds_by_process": [round(t, 2) for t in by_process],
            "server_connections_by_process": established(self.pids, self.port),
        }


async def memory_over_reviews(
    clients: list[Client], mix: list[Any], reviews: int, pid: int
) -> dict[str, Any]:
    """Memory over N reviews, 200 in flight at a time (closed loop)."""
    samples = [{"reviews": 0, "rss_kib": rss_kib(pid)}]
    done = 0
    errors: list[str] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(reviews):
        queue.put_nowait(n)

    async def worker(client: Client) -> None:
        nonlocal done
        while True:
            try:
                n = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            path, make, check = mix[n % len(mix)]
            _, error = await one(client, path, make(), check)
            if error:
                errors.append(error)
            done += 1
            if done % 1000 == 0:
                samples.append({"reviews": done, "rss_kib": rss_kib(pid)})

    await asyncio.gather(*(worker(c) for c in clients))
    baseline = next(s["rss_kib"] for s in samples if s["reviews"] >= 1000)
    final = samples[-1]["rss_kib"]
    return {
        "reviews": reviews,
        "errors": len(errors),
        "error_samples": errors[:3],
        "rss_samples": samples,
        "growth_after_first_1000_kib": final - baseline,
        "growth_after_first_1000_pct": round(100 * (final - baseline) / baseline, 2),
    }


async def run(args: argparse.Namespace, registry: str, slow: str, work: Path) -> dict[str, Any]:
    certs = work / "certs"
    import subprocess

    subprocess.run(
        [str(REPO / "deploy/make-cert.sh"), "--out", str(certs), "--ip", "127.0.0.1"],
        check=True,
        capture_output=True,
    )
    key, pub = live.generate_key(work / "keys", "bench")
    h100 = live.push_target(registry, REPOSITORY, "h100", "h100", work / "h100")
    live.sign(h100, key)
    unsigned = live.push_target(registry, REPOSITORY, "unsigned", "h100", work / "unsigned")

    def signed(prefix: str, count: int) -> list[Any]:
        images = []
        for i in range(count):
            image = live.push_target(registry, REPOSITORY, f"{prefix}-{i}", "h100", work / f"{prefix}-{i}")
            live.sign(image, key)
            images.append(image)
        return images

    fresh = signed("fresh", args.fresh)
    # Half for the control window, half for the burst.
    during_burst = signed("burst-fresh", 2 * args.burst_fresh)
    # The policy's defaults for capacity: concurrency 8, registry_concurrency 4, registry_queue 64.
    policy = live.write_policy(
        work / "policy.yaml", [f"{registry}/kernelbake/**", f"{slow}/kernelbake/**"], pub
    )
    # The webhook takes only the API server's client certificate (--client-ca, as deployed),
    # which its own --help says it can: a server from before (an A/B's other side, run by
    # PYTHONPATH) serves any client, and is not offered the flag.
    tls = client_tls(certs)
    helped = subprocess.run(
        [*live.KERNELBAKE, "admission", "--help"], capture_output=True, text=True, check=True
    ).stdout
    result: dict[str, Any] = {"server_client_ca": "--client-ca" in helped}
    with live.serving(policy, certs, workers=args.workers, client_ca="--client-ca" in helped) as served:
        pid = served.process.pid
        clients = [await Client.open(served.port, tls) for _ in range(args.concurrency)]
        try:
            result["first_review_of_a_new_digest"] = await first_reviews(clients[0], fresh)
            mix = workload(registry, h100, unsigned)
            await warm_up(clients, mix)
            result[f"warm_cache_{args.concurrency}_concurrent"] = await warm_waves(
                clients, mix, args.waves, (pid, served.port)
            )
            result["memory_over_reviews"] = await memory_over_reviews(clients, mix, args.reviews, pid)
            if args.burst:
                result["slow_registry_burst"] = await slow_registry_burst(
                    args, served.port, tls, certs / "ca.crt", clients, mix, during_burst, slow
                )
        finally:
            for c in clients:
                c.close()
        assert served.process.poll() is None, "the server died:\n" + served.log
    # This process's, over the whole run (the burst's sender counts its own): with kept-alive
    # connections, --concurrency + 1 (the slow-registry probe), each one full TLS handshake.
    result["connections"] = {
        "opened": Client.opened,
        "tls_sessions_resumed": Client.resumed,
        "closed_by_server": Client.closed_by_server,
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--waves", type=int, default=20, help="waves of --concurrency warm reviews")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help="reviews per wave, each on a kept-alive connection of its own (default 200)",
    )
    parser.add_argument("--reviews", type=int, default=10_000, help="reviews for the memory check")
    parser.add_argument("--fresh", type=int, default=20, help="new digests for the first-review latency")
    parser.add_argument(
        "--burst", type=int, default=250, help="new digests sent at the slow registry (0: skip)"
    )
    parser.add_argument(
        "--burst-fresh",
        type=int,
        default=10,
        help="new healthy digests reviewed during the burst (as many again without it)",
    )
    parser.add_argument(
        "--burst-window", type=float, default=30.0, help="seconds of healthy reviews from the burst on"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="kernelbake admission --workers (default: one per core)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kb-admission-bench-") as tmp:
        work = Path(tmp)
        with (
            running_registry(work / "registry") as registry,
            running_registry(work / "slow-registry") as upstream,
            drip_proxy(upstream, DRIP_SECONDS) as slow,
        ):
            measured = asyncio.run(run(args, registry, slow, work))
    warm = measured[f"warm_cache_{args.concurrency}_concurrent"]
    first = measured["first_review_of_a_new_digest"]
    memory = measured["memory_over_reviews"]
    targets = {
        "warm_errors_zero": warm["errors"] == 0 and memory["errors"] == 0,
        "warm_p99_le_50ms": warm["p99_ms"] <= 50,
        "first_review_le_500ms": first["max_ms"] <= 500 and first["errors"] == 0,
        # Flat: after the first 1,000 reviews (imports, pools, caches filled) RSS grows < 5 %.
        "memory_flat": memory["growth_after_first_1000_pct"] < 5,
    }
    burst = measured.get("slow_registry_burst")
    if burst is not None:
        healthy_warm = burst["healthy_during_burst"]["warm_200_concurrent"]
        healthy_first = burst["healthy_during_burst"]["first_review"]
        targets |= {
            "burst_healthy_warm_p99_le_50ms": healthy_warm["p99_ms"] <= 50 and healthy_warm["errors"] == 0,
            "burst_healthy_first_review_le_500ms": healthy_first.get("max_ms", 0) <= 500
            and healthy_first["errors"] == 0,
            # Fail closed, within the deadline (8 s) plus the generator's own delay.
            "burst_slow_registry_denied_503": burst["burst"]["other"] == 0
            and burst["burst"]["max_ms"] <= 9000,
        }
    report = {
        "bench": "admission_load",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            # Other work on the host shows up here (and in the tail latencies).
            "loadavg_1_5_15_before": [round(v, 2) for v in load_before],
            "loadavg_1_5_15_after": [round(v, 2) for v in os.getloadavg()],
        },
        "server": f"kernelbake admission --workers {args.workers} (default log level)",
        "note": "load generator (asyncio, same host) and server share the CPUs",
        **measured,
        "targets": targets,
        "pass": all(targets.values()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
