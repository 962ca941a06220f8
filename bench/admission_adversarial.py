"""Adversarial reviews against the admission webhook (issue 32, item 1): pod specs shaped to
make one review expensive, at growing sizes up to the largest body the server accepts
(``server.MAX_BODY``), against the real parts: ``kernelbake admission --workers 2`` (as
deploy/deployment.yaml runs it) serving HTTPS, images and a cache artifact in a local
docker-registry signed by ``kernelbake sign``.

Each review is sent to both workers at once (one kept-alive connection on each: the bench
finds which worker holds a connection from /proc), so that both hold the largest body together,
the worst case for the pod's memory. Meanwhile a process of its own polls ``GET /healthz`` every
10 ms on one connection per worker. For every shape and size it records the body and reply
bytes, the time to the answer, the answer (allowed, code, the message's start), the server's
peak resident memory (the parent and both workers: each process's VmHWM, reset before the row
through /proc/PID/clear_refs, summed; pages the workers share count twice, so the sum is an
upper bound) and the /healthz latencies while the row ran.

The deployed limit (512 MiB, deploy/deployment.yaml) is enforced as the kubelet enforces it:
the server runs in a memory cgroup of its own with that limit (``bench/memory_cgroup.py``;
where none can be made the JSON says the limit was measured only), so a review that needed more
would be reclaimed against and then OOM-killed, and the run would fail. The cgroup's own peak
(resident pages and page cache) and its OOM kills are in the JSON beside the VmHWM sum.

One row (``multiplied_delta``, issue 41 item 4) pushes a signed 99,996-file cache delta under
four repository names (one digest, each name signed) and sends the review of a pod that names
all four, never verified before, to both workers at once.

After the bodies, the connection rows of ``bench/admission_connections.py`` (issue 41): a
40 s churn of connections that half-close, then a 6.6 MB review; 1,023 held TLS connections
while new connections send reviews and probes (the server runs with ``--health-port``).

Targets: peak RSS under the deployed limit, /healthz p99 under 100 ms, replies bounded
(≤ 8 KiB: the message is cut to 4 KiB), every review answered with an AdmissionReview (HTTP
200), and the body over the limit refused with HTTP 413; after the churn every worker back
within 32 MiB of its RSS before it and the review answered; while connections are held, every
new connection's review and every probe on the probes' port answered.

    .venv/bin/python bench/admission_adversarial.py [--sizes 65536,1048576,4194304,8388608] [--out PATH]

A smaller run, to check that it still runs end to end (its figures are no result; keep it out of
bench/results):

    .venv/bin/python bench/admission_adversarial.py --sizes 65536 --flood 300 --delta-files 2000 \
        --churn-seconds 5 --max-connections 64 --hold-seconds 10 --out /tmp/adversarial-small.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import http.client
import json
import multiprocessing
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from tests.admission import documents  # noqa: E402

import admission_connections as connections  # noqa: E402 (bench/ is on the path from here)
from kernelbake.admission.bounds import MAX_CONNECTIONS, MESSAGE_BYTES  # noqa: E402
from kernelbake.admission.http.server import MAX_BODY  # noqa: E402
from kernelbake.admission.rules.caches import ANNOTATION_CONTAINER, ANNOTATION_INDEX  # noqa: E402
from memory_cgroup import limited  # noqa: E402

RESULTS = REPO / "bench" / "results" / "admission_adversarial.json"
REPOSITORY = "kernelbake/qwen3-0.6b"
ARTIFACT_REPOSITORY = "kernelbake/tiny-llama"
H100 = "NVIDIA-H100-80GB-HBM3"
PRODUCT = "nvidia.com/gpu.product"
CACHE_ROOT = "/opt/kernelbake/cache"
# deploy/deployment.yaml: resources.limits.memory of the admission container.
MEMORY_LIMIT = 512 * 1024 * 1024
HEALTHZ_P99_MS = 100.0
# An answer: the message (MESSAGE_BYTES after its prefix), a few warnings, the envelope.
REPLY_BOUND = 2 * MESSAGE_BYTES
PROBE_SECONDS = 0.01
# Reviews sent at once on each worker in the concurrent rows, and the shapes sent so.
CONCURRENT = 3
CONCURRENT_SHAPES = ("cache_volumes_16_x_containers", "containers")
# Silent connections opened at once: past what two workers hold (2 x MAX_CONNECTIONS).
FLOOD = 3000
DEFAULT_SIZES = (64 * 1024, 1024 * 1024, 4 * 1024 * 1024, MAX_BODY)
# Another engine image than the one the artifact's caches were compiled in (and not governed).
OTHER_ENGINE = "registry.example.com/engine/vllm-cpu@sha256:" + "9" * 64
UNGOVERNED = "docker.io/library/busybox:1.36"


# ---- the shapes: pure functions of (references, target size) -> AdmissionReview body ----------


@dataclasses.dataclass(frozen=True)
class Refs:
    """What the bodies name: the signed image pinned, the signed cache artifact pinned, and
    the repository in which uncached digests are made up."""

    image: str
    artifact: str
    repository: str


def encode(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def review_of(spec: dict[str, Any], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """A Deployment CREATE as the API server sends it, around a pod template."""
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "adversarial", "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "adversarial"}},
            "template": {"metadata": metadata or {"labels": {"app": "adversarial"}}, "spec": spec},
        },
    }
    return documents.review_of(deployment, uid="7f0b2a4c-0000-4000-8000-00000000a032")


def engine(image: str) -> dict[str, Any]:
    return {"name": "vllm", "image": image, "resources": {"limits": {"nvidia.com/gpu": "1"}}}


def on_h100(spec: dict[str, Any]) -> dict[str, Any]:
    spec["nodeSelector"] = {PRODUCT: H100}
    return spec


def largest(build: Callable[[int], Any], target: int) -> tuple[int, bytes]:
    """``(n, body)``: the largest ``n`` whose ``build(n)`` encodes to at most ``target`` bytes.
    ``build`` grows by a fixed number of bytes per item from the second on (the items are
    spelled with fixed-width numbers), so ``n`` is extrapolated from two small bodies, then
    checked."""
    sizes = [len(encode(build(n))) for n in (0, 1, 2)]
    if sizes[0] > target:
        raise ValueError(f"even the smallest body is over {target} bytes")
    if sizes[1] > target:
        return 0, encode(build(0))
    step = sizes[2] - sizes[1]
    n = 1 + (target - sizes[1]) // step
    body = encode(build(n))
    while len(body) > target:
        n -= 1
        body = encode(build(n))
    return n, body


def cache_volumes(refs: Refs, volumes: int) -> Callable[[int], Any]:
    """``volumes`` image volumes of the signed cache artifact and ``n`` containers mounting an
    emptyDir at the cache root, each running another engine image than the caches': volumes
    times containers problems (issue 32: 300 x 300 gave a 47 MB reply)."""

    def build(n: int) -> Any:
        spec = on_h100(
            {
                "containers": [
                    {
                        "name": f"c{i:07d}",
                        "image": OTHER_ENGINE,
                        "volumeMounts": [{"name": "kernelbake-cache", "mountPath": CACHE_ROOT}],
                    }
                    for i in range(n)
                ],
                "volumes": [
                    {
                        "name": f"art-{i:04d}",
                        "image": {"reference": refs.artifact, "pullPolicy": "IfNotPresent"},
                    }
                    for i in range(volumes)
                ]
                + [{"name": "kernelbake-cache", "emptyDir": {}}],
            }
        )
        return review_of(spec)

    return build


def placement_at_caps(refs: Refs, terms: int = 64, expressions: int = 64) -> Callable[[int], Any]:
    """``terms`` nodeSelectorTerms of ``expressions`` ``gpu.product In`` lists of ``n`` products
    each (the signed image's GPU among made-up ones): GPU products by placement terms."""

    def build(n: int) -> Any:
        values = [H100, *(f"NVIDIA-Made-Up-{i:05d}" for i in range(n))]
        term = {"matchExpressions": [{"key": PRODUCT, "operator": "In", "values": values}] * expressions}
        spec = {
            "containers": [engine(refs.image)],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term] * terms}
                }
            },
        }
        return review_of(spec)

    return build


def product_list(refs: Refs) -> Callable[[int], Any]:
    """One ``gpu.product In`` list of ``n`` products (past the cap of values from ~1k on)."""

    def build(n: int) -> Any:
        values = [H100, *(f"NVIDIA-Made-Up-{i:07d}" for i in range(n))]
        term = {"matchExpressions": [{"key": PRODUCT, "operator": "In", "values": values}]}
        spec = {
            "containers": [engine(refs.image)],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            },
        }
        return review_of(spec)

    return build


def node_selector(refs: Refs) -> Callable[[int], Any]:
    """A nodeSelector of the signed image's GPU and ``n`` more labels."""

    def build(n: int) -> Any:
        spec = on_h100({"containers": [engine(refs.image)]})
        spec["nodeSelector"].update({f"example.com/label-{i:07d}": "x" for i in range(n)})
        return review_of(spec)

    return build


def containers(refs: Refs, *, uncached: int | None = None) -> Callable[[int], Any]:
    """The signed image on its GPU and ``n`` more containers of an ungoverned image; with
    ``uncached``, one more naming a digest nobody has reviewed (made up from the number:
    the review waits for its verification, then decides over the whole pod)."""

    def build(n: int) -> Any:
        spec = on_h100(
            {
                "containers": [engine(refs.image)]
                + [{"name": f"c{i:07d}", "image": UNGOVERNED} for i in range(n)]
            }
        )
        if uncached is not None:
            digest = hashlib.sha256(b"uncached-%d" % uncached).hexdigest()
            spec["containers"].append(engine(f"{refs.repository}@sha256:{digest}") | {"name": "fresh"})
        return review_of(spec)

    return build


def annotation_value(refs: Refs) -> Callable[[int], Any]:
    """A cache opt-in whose container annotation is ``n`` bytes long (the message names it)."""

    def build(n: int) -> Any:
        metadata = {
            "labels": {"app": "adversarial"},
            "annotations": {ANNOTATION_INDEX: refs.artifact, ANNOTATION_CONTAINER: "x" * n},
        }
        return review_of(on_h100({"containers": [engine(refs.image)]}), metadata)

    return build


def annotations(refs: Refs) -> Callable[[int], Any]:
    """``n`` annotations on the pod template (nothing of kernelbake's among them)."""

    def build(n: int) -> Any:
        metadata = {
            "labels": {"app": "adversarial"},
            "annotations": {f"example.com/note-{i:07d}": "y" * 32 for i in range(n)},
        }
        return review_of(on_h100({"containers": [engine(refs.image)]}), metadata)

    return build


def over_max_body(refs: Refs) -> bytes:
    """The annotation-value body one byte larger than the server accepts."""
    over = annotation_value(refs)
    return encode(over(MAX_BODY - len(encode(over(0))) + 1))


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    what: str
    # refs, the number of the send (for made-up digests) -> the builder of n items.
    builder: Callable[[Refs, int], Callable[[int], Any]]
    items: str


SHAPES = (
    Shape(
        "cache_volumes_16_x_containers",
        "16 image volumes of the signed cache artifact (the cap) x n containers at the cache root",
        lambda refs, _: cache_volumes(refs, 16),
        "containers",
    ),
    Shape(
        "cache_volumes_300_x_containers",
        "300 image volumes of the signed cache artifact (past the cap) x n containers at the cache root",
        lambda refs, _: cache_volumes(refs, 300),
        "containers",
    ),
    Shape(
        "placement_64_terms_x_64_expressions",
        "64 nodeSelectorTerms x 64 gpu.product In lists (the caps) of n products each",
        lambda refs, _: placement_at_caps(refs),
        "products per list",
    ),
    Shape(
        "product_list",
        "one gpu.product In list of n products",
        lambda refs, _: product_list(refs),
        "products",
    ),
    Shape("node_selector", "nodeSelector of n labels", lambda refs, _: node_selector(refs), "labels"),
    Shape(
        "containers",
        "n containers of an ungoverned image beside the signed one",
        lambda refs, _: containers(refs),
        "containers",
    ),
    Shape(
        "containers_and_an_uncached_digest",
        "n containers of an ungoverned image and one naming a digest not reviewed before (verified first)",
        lambda refs, send: containers(refs, uncached=send),
        "containers",
    ),
    Shape(
        "annotation_value",
        "a cache opt-in whose cache-container annotation is n bytes",
        lambda refs, _: annotation_value(refs),
        "bytes",
    ),
    Shape(
        "annotations", "n annotations on the pod template", lambda refs, _: annotations(refs), "annotations"
    ),
)


# ---- the server's processes ----------------------------------------------------------------


def tree(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(p for child in children for p in tree(int(child)))]


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peaks(pids: Sequence[int]) -> None:
    # "5" resets the peak resident set size (VmHWM) to the current one (proc(5)).
    for pid in pids:
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def peak_bytes(pids: Sequence[int]) -> int:
    return 1024 * sum(status_kib(pid, "VmHWM") for pid in pids)


def rss_bytes(pids: Sequence[int]) -> int:
    return 1024 * sum(status_kib(pid, "VmRSS") for pid in pids)


def pss_bytes(pids: Sequence[int]) -> int:
    """The processes' proportional set sizes, summed: a page shared by the workers (the parent's
    imports, kept after fork) counts once, as the pod's memory cgroup charges it."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1])
    return 1024 * total


def owner(sock: Any, server_port: int, pids: Sequence[int]) -> int | None:
    """The process holding the server side of the TCP connection ``sock`` (IPv4 loopback)."""
    mine = sock.getsockname()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.split(":")[1], 16) == server_port and int(remote.split(":")[1], 16) == mine:
            inode = fields[9]
    if inode is None:
        return None
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if str(fd.readlink()) == f"socket:[{inode}]":
                    return pid
    return None


def connection_to_each(
    port: int, cafile: str, workers: Sequence[int], per_worker: int = 1
) -> list[tuple[int, http.client.HTTPSConnection]]:
    """``per_worker`` kept-alive HTTPS connections held by each worker, as (worker, connection)
    (the kernel spreads new connections across the workers: open until each has its share)."""
    tls = connections.api_server_tls(cafile)
    found: list[tuple[int, http.client.HTTPSConnection]] = []
    for _ in range(200 * per_worker):
        if len(found) == per_worker * len(workers):
            return sorted(found, key=lambda item: item[0])
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=120)
        conn.connect()
        # The worker accepts (and finishes the handshake) on its loop: wait for its socket.
        pid = None
        for _ in range(100):
            pid = owner(conn.sock, port, workers)
            if pid is not None:
                break
            time.sleep(0.01)
        if pid is not None and sum(w == pid for w, _ in found) < per_worker:
            found.append((pid, conn))
        else:
            conn.close()
    raise RuntimeError(f"could not open a connection to each of the workers {list(workers)}")


# ---- /healthz, from a process of its own ------------------------------------------------------


def prober(port: int, cafile: str, workers: list[int], conn: Connection) -> None:
    """Poll /healthz every PROBE_SECONDS on one connection per worker until told to stop;
    send back ``(worker, started, seconds or None)`` for each probe."""
    connections = connection_to_each(port, cafile, workers)
    stop = threading.Event()
    samples: list[tuple[int, float, float | None]] = []

    def poll(worker: int, c: http.client.HTTPSConnection) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                c.request("GET", "/healthz")
                c.getresponse().read()
                samples.append((worker, started, time.monotonic() - started))
            except (OSError, http.client.HTTPException):
                samples.append((worker, started, None))
                c.close()
                c = http.client.HTTPSConnection("127.0.0.1", port, context=connections.api_server_tls(cafile))
            stop.wait(max(0.0, started + PROBE_SECONDS - time.monotonic()))

    threads = [threading.Thread(target=poll, args=item, daemon=True) for item in connections]
    for t in threads:
        t.start()
    conn.send("ready")
    conn.recv()
    stop.set()
    for t in threads:
        t.join(30)
    conn.send(samples)


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def healthz_summary(
    samples: Sequence[tuple[int, float, float | None]], start: float, end: float
) -> dict[str, Any]:
    inside = [s for s in samples if start <= s[1] <= end]
    ms = [s[2] * 1000 for s in inside if s[2] is not None]
    out: dict[str, Any] = {"probes": len(inside), "failed": len(inside) - len(ms)}
    if ms:
        out |= {
            "p50_ms": round(percentile(ms, 0.5), 2),
            "p99_ms": round(percentile(ms, 0.99), 2),
            "max_ms": round(max(ms), 2),
        }
    return out


# ---- one row: a body to every worker at once ---------------------------------------------------


def post(conn: http.client.HTTPSConnection, body: bytes) -> dict[str, Any]:
    started = time.monotonic()
    try:
        conn.request("POST", "/validate?timeout=10s", body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        payload = response.read()
    except (OSError, http.client.HTTPException) as exc:
        return {"http": None, "error": repr(exc)[:200], "seconds": round(time.monotonic() - started, 3)}
    out: dict[str, Any] = {
        "http": response.status,
        "seconds": round(time.monotonic() - started, 3),
        "reply_bytes": len(payload),
    }
    if response.status == 200:
        answer = json.loads(payload)["response"]
        out |= {"allowed": answer["allowed"]}
        if not answer["allowed"]:
            out |= {"code": answer["status"]["code"], "message_start": answer["status"]["message"][:160]}
    else:
        out["error"] = payload[:160].decode(errors="replace")
    if response.getheader("connection", "").lower() == "close":
        conn.close()
    return out


@dataclasses.dataclass
class Server:
    port: int
    pid: int
    cafile: str
    connections: list[tuple[int, http.client.HTTPSConnection]]

    @property
    def workers(self) -> list[int]:
        return tree(self.pid)[1:] or [self.pid]

    def reconnect(self, per_worker: int = 1) -> None:
        for _, c in self.connections:
            c.close()
        self.connections = connection_to_each(self.port, self.cafile, self.workers, per_worker)


class Sampler:
    """The server's resident memory (all its processes) every 10 ms, while a row runs."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = pids
        self.peak = 0
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_bytes(self.pids))
                self.peak_pss = max(self.peak_pss, pss_bytes(self.pids))
            self._stop.wait(0.01)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def silent_connections(port: int, n: int) -> list[socket.socket]:
    """``n`` TCP connections to the server that never send a byte (each worker holds at most
    --max-connections of them, handshakes included, and drops the rest at once)."""
    held = []
    for _ in range(n):
        with contextlib.suppress(OSError):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    return held


def flood_row(server: Server, refs: Refs) -> tuple[dict[str, Any], float, float]:
    """A small review on every kept-alive connection while FLOOD silent connections are held;
    the window (for /healthz) runs from the first connection opened to the last one closed."""
    start = time.monotonic()
    held = silent_connections(server.port, FLOOD)
    try:
        time.sleep(1.0)
        body = encode(annotations(refs)(0))
        measured, _, _ = row(server, [body] * len(server.connections))
        time.sleep(1.0)
    finally:
        for s in held:
            s.close()
    end = time.monotonic()
    entry = {
        "shape": "silent_connections",
        "connections": FLOOD,
        "held": len(held),
        "body_bytes": len(body),
        "items": FLOOD,
        "item": "TCP connections held open without a TLS handshake while reviews run",
        **measured,
    }
    return entry, start, end


def row(
    server: Server, bodies: Sequence[bytes], send: Callable[..., dict[str, Any]] | None = None
) -> tuple[dict[str, Any], float, float]:
    """Send ``bodies[i]`` on the server's ``i``-th connection, all at once."""
    pids = tree(server.pid)
    before = {pid: status_kib(pid, "VmRSS") for pid in pids}
    reset_peaks(pids)
    answers: dict[int, dict[str, Any]] = {}
    sender = send or post

    def one(i: int) -> None:
        answers[i] = sender(server.connections[i][1], bodies[i])

    start = time.monotonic()
    with Sampler(pids) as sampler:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(server.connections))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    end = time.monotonic()
    result = {
        "answers": [answers[i] for i in range(len(server.connections))],
        "peak_rss": peak_bytes(pids),
        "sampled_peak_rss": sampler.peak,
        "sampled_peak_pss": sampler.peak_pss,
        "processes_kib": {
            str(pid): {"rss_before": before[pid], "peak": status_kib(pid, "VmHWM")} for pid in pids
        },
    }
    if any(a.get("http") != 200 for a in answers.values()):
        server.reconnect(len(server.connections) // len(server.workers))
    return result, start, end


def connection_rows(
    server: Server, refs: Refs, limit: Any, log: str
) -> list[tuple[dict[str, Any], float, float]]:
    """The churn and held-connection rows (``bench/admission_connections.py``)."""
    probes = re.search(r"probes on http://127\.0\.0\.1:(\d+)", log)
    if probes is None:
        raise RuntimeError("the server did not say where its probes are:\n" + log)
    pids = tree(server.pid)

    def review() -> dict[str, Any]:
        # To each worker in turn: two at once are 13.2 MB, past the pod's 8 MiB body budget,
        # and the second would wait for the first's share (a 503 on a busy host).
        n, body = largest(containers(refs), connections.AFTER_CHURN_BYTES)
        reset_peaks(pids)
        with Sampler(pids) as sampler:
            answers = [post(conn, body) for _, conn in server.connections]
        return {
            "body_bytes": len(body),
            "review_items": n,
            "answers": answers,
            "peak_rss": peak_bytes(pids),
            "sampled_peak_rss": sampler.peak,
            "sampled_peak_pss": sampler.peak_pss,
        }

    churn = connections.churn_row(
        server, pids, lambda: connections.cgroup_usage(limit.path, limit.version), review
    )
    print(connections.dumps(churn[0]), file=sys.stderr)
    held = connections.held_row(server, int(probes.group(1)), encode(annotations(refs)(0)))
    print(connections.dumps(held[0]), file=sys.stderr)
    return [churn, held]


def declare_only(conn: http.client.HTTPSConnection, body: bytes) -> dict[str, Any]:
    """The head of a POST declaring ``len(body)`` bytes, then the answer: the server refuses a
    body over its limit from the Content-Length, before reading any of it."""
    started = time.monotonic()
    try:
        conn.putrequest("POST", "/validate?timeout=10s")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        response = conn.getresponse()
        payload = response.read()
    except (OSError, http.client.HTTPException) as exc:
        return {"http": None, "error": repr(exc)[:200], "seconds": round(time.monotonic() - started, 3)}
    conn.close()
    return {
        "http": response.status,
        "seconds": round(time.monotonic() - started, 3),
        "reply_bytes": len(payload),
        "error": payload[:160].decode(errors="replace"),
    }


# ---- one signed blob under many names (issue 41, item 4) -------------------------------------

# A delta of as many files as the (contract.delta.MAX_FILES is 100,000), copied byte for
# byte under this many repository names, each signed: one review names them all.
DELTA_FILES = 99_996
DELTA_NAMES = 4
DELTA_ROOT = "/opt/kernelbake/delta"


def multiplied_delta(refs: Refs, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Push one signed DELTA_FILES-file delta layered on the signed image under DELTA_NAMES
    repositories (the same digest), signed with the bench's key (``world``'s work/keys), and the
    review of a pod that runs the image, mounts the first at DELTA_ROOT and names the others as
    image volumes. Returns (the review, what was pushed)."""
    from kernelbake.contract.delta import DeltaFile, DeltaManifest, Origin, Rebuild
    from kernelbake.contract.key import key_from_labels
    from kernelbake.contract.layout import CacheKind
    from kernelbake.oci import RegistryClient, parse_reference
    from kernelbake.oci.types import sha256_digest
    from kernelbake.remote import read_cache_manifest, read_image
    from kernelbake.signing.delta import push_delta
    from kernelbake.signing.keys import load_private_key
    from kernelbake.signing.sign import sign_image
    from kernelbake.signing.signer import KeySigner

    client = RegistryClient(timeout=120)
    base = parse_reference(refs.image)
    facts = read_image(client, base, client.get_manifest(base))
    _layer, cache_manifest = read_cache_manifest(client, facts)
    source = work / "multiplied-delta"
    files = []
    empty = hashlib.sha256(b"").hexdigest()
    for i in range(DELTA_FILES):
        name = hashlib.sha256(str(i).encode()).hexdigest()
        rel = f"triton/{i % 256:02x}{name[:30]}/{name[30:]}.cubin"
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).touch()
        files.append(DeltaFile(path=rel, size=0, sha256=empty, kind=CacheKind.TRITON))
    # A rebuilt delta, as the default policy admits (a replica's own bytes are refused at push):
    # no record was replayed here, so the record's digest is a stand-in.
    delta = DeltaManifest(
        key=key_from_labels(facts.labels),
        base_image=None,
        base_manifest=sha256_digest(cache_manifest),
        files=tuple(files),
        replica="bench",
        origin=Origin.REBUILT,
        rebuild=Rebuild(builder="bench", image=str(base.digest), record="sha256:" + "0" * 64),
    )
    (source / "delta.json").write_text(delta.to_json())
    signer = KeySigner(load_private_key(work / "keys" / "bench.key"))
    registry = refs.repository.split("/", 1)[0]
    first = push_delta(
        source, base=refs.image, signer=signer, client=client, to=f"{registry}/kernelbake/delta-copy-0:d"
    )
    # The others: its manifest and blobs copied byte for byte (as `crane copy` would), each
    # name signed, no attestation (a delta's review reads its signature only).
    pinned = parse_reference(first.reference)
    top = client.get_manifest(pinned)
    tagged = [first.tagged]
    for i in range(1, DELTA_NAMES):
        dest = parse_reference(f"{registry}/kernelbake/delta-copy-{i}:d")
        for blob in (top.config, *top.layers):
            client.put_blob(dest, client.get_blob(pinned, blob.digest, max_bytes=1 << 30))
        client.put_manifest(dest, top.data, top.media_type)
        sign_image(f"{dest.name}@{top.digest}", signer, client=client, attest=False)
        tagged.append(f"{dest.name}:{dest.tag}")
    container = engine(refs.image)
    container["volumeMounts"] = [{"name": "delta-0", "mountPath": DELTA_ROOT, "readOnly": True}]
    container["env"] = [{"name": "KERNELBAKE_DELTA_DIGEST", "value": first.manifest_digest}]
    spec = on_h100(
        {
            "containers": [container],
            "volumes": [{"name": f"delta-{i}", "image": {"reference": t}} for i, t in enumerate(tagged)],
        }
    )
    what = {
        "files": DELTA_FILES,
        "names": DELTA_NAMES,
        "digest": top.digest,
        "delta_json_bytes": len(delta.to_json().encode()),
    }
    return review_of(spec), what


def multiplied_delta_row(server: Server, refs: Refs, work: Path) -> tuple[dict[str, Any], float, float]:
    """The review naming one signed delta under DELTA_NAMES names, on every worker at once,
    none of them verified before: each worker verifies every name's signature and reads the
    delta.json once, and the pod reads one at a time (admission.delta_reads)."""
    doc, what = multiplied_delta(refs, work)
    body = encode(doc)
    # Pushing took minutes: the server has closed the idle kept-alive connections by now.
    server.reconnect(1)
    measured, start, end = row(server, [body] * len(server.connections))
    entry = {
        "shape": "multiplied_delta",
        "what": f"one signed {DELTA_FILES}-file delta under {DELTA_NAMES} repository names, in one review",
        **what,
        "body_bytes": len(body),
        "items": DELTA_NAMES,
        "item": "repository names of one signed delta",
        **measured,
    }
    return entry, start, end


# ---- the run -------------------------------------------------------------------------------


@contextlib.contextmanager
def world(work: Path) -> Iterator[tuple[Refs, Path, Path]]:
    """A registry with the signed image and the signed cache artifact, a CA and a policy."""
    from tests.admission import live
    from tests.signing.test_cache_artifact import push_artifact
    from tests.support.registry import running_registry

    from kernelbake.oci import RegistryClient

    with running_registry(work / "registry") as registry:
        certs = work / "certs"
        subprocess.run(
            [str(REPO / "deploy/make-cert.sh"), "--out", str(certs), "--ip", "127.0.0.1"],
            check=True,
            capture_output=True,
        )
        key, pub = live.generate_key(work / "keys", "bench")
        h100 = live.push_target(registry, REPOSITORY, "h100", "h100", work / "h100")
        live.sign(h100, key)
        artifact = push_artifact(RegistryClient(timeout=30), registry, work / "artifact", ARTIFACT_REPOSITORY)
        live.sign(artifact, key)
        policy = live.write_policy(work / "policy.yaml", [f"{registry}/kernelbake/**"], pub)
        yield Refs(h100.pinned, artifact.pinned, f"{registry}/{REPOSITORY}"), policy, certs


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from tests.admission import live

    rows: list[dict[str, Any]] = []
    with (
        world(work) as (refs, policy, certs),
        limited(MEMORY_LIMIT) as limit,
        live.serving(
            policy,
            certs,
            workers=args.workers,
            wrap=limit.wrap,
            options=["--health-port", "0", "--max-connections", str(args.max_connections)],
        ) as served,
    ):
        cafile = str(certs / "ca.crt")
        # The parent says it listens before it forks the workers: wait for them.
        ends = time.monotonic() + 30
        while args.workers > 1 and len(tree(served.process.pid)) <= args.workers:
            if time.monotonic() > ends:
                raise RuntimeError(f"the server did not start {args.workers} workers:\n{served.log}")
            time.sleep(0.05)
        workers = tree(served.process.pid)[1:] or [served.process.pid]
        server = Server(
            served.port, served.process.pid, cafile, connection_to_each(served.port, cafile, workers)
        )
        mp = multiprocessing.get_context("spawn")
        ours, theirs = mp.Pipe()
        probe = mp.Process(target=prober, args=(served.port, cafile, workers, theirs), daemon=True)
        probe.start()
        if ours.recv() != "ready":
            raise RuntimeError("the /healthz prober did not start")
        windows: list[tuple[dict[str, Any], float, float]] = []
        try:
            # Warm: the signed image and the artifact verified on each worker (cached after).
            small = annotations(refs)(0)
            artifact_pod = cache_volumes(refs, 1)(1)
            for body in (small, artifact_pod):
                measured, start, end = row(server, [encode(body)] * len(server.connections))
                windows.append(
                    ({"shape": "warm-up", "body_bytes": len(encode(body)), **measured}, start, end)
                )
            # At rest: /healthz with nothing else to do.
            rest_start = time.monotonic()
            time.sleep(1.0)
            windows.append(({"shape": "at_rest"}, rest_start, time.monotonic()))
            sends = 0
            for shape in SHAPES:
                for target in args.sizes:
                    smallest = len(encode(shape.builder(refs, 0)(0)))
                    if smallest > target:
                        # The shape at its caps is larger than this size already.
                        windows.append(
                            (
                                {
                                    "shape": shape.name,
                                    "target_bytes": target,
                                    "skipped": f"its smallest body is {smallest} bytes",
                                },
                                0.0,
                                0.0,
                            )
                        )
                        continue
                    bodies = []
                    for _ in server.connections:
                        sends += 1
                        n, body = largest(shape.builder(refs, sends), target)
                        bodies.append(body)
                    measured, start, end = row(server, bodies)
                    entry = {
                        "shape": shape.name,
                        "target_bytes": target,
                        "body_bytes": len(bodies[0]),
                        "items": n,
                        "item": shape.items,
                        **measured,
                    }
                    windows.append((entry, start, end))
                    print(
                        json.dumps({k: entry[k] for k in ("shape", "body_bytes", "items")}), file=sys.stderr
                    )
            # One signed blob under many names, never verified before, on every worker at once.
            windows.append(multiplied_delta_row(server, refs, work))
            # The API server opens more connections when reviews are slow: the largest bodies
            # of the heaviest shapes, CONCURRENT at once on each worker.
            server.reconnect(CONCURRENT)
            for shape in (s for s in SHAPES if s.name in CONCURRENT_SHAPES):
                bodies = []
                for _ in server.connections:
                    sends += 1
                    n, body = largest(shape.builder(refs, sends), max(args.sizes))
                    bodies.append(body)
                measured, start, end = row(server, bodies)
                entry = {
                    "shape": f"{shape.name}_{CONCURRENT}_per_worker_at_once",
                    "target_bytes": max(args.sizes),
                    "body_bytes": len(bodies[0]),
                    "items": n,
                    "item": shape.items,
                    **measured,
                }
                windows.append((entry, start, end))
            server.reconnect(1)
            # Connections that never start a TLS handshake, more than the workers hold together:
            # reviews on the API server's kept-alive connections go on meanwhile.
            windows.append(flood_row(server, refs))
            server.reconnect(1)
            windows += connection_rows(server, refs, limit, served.log)
            # One byte past the limit: HTTP 413 from the head, before any of the body is read.
            body = over_max_body(refs)
            measured, start, end = row(server, [body] * len(server.connections), declare_only)
            windows.append(({"shape": "over_max_body", "body_bytes": len(body), **measured}, start, end))
        finally:
            ours.send("stop")
            samples = ours.recv()
            probe.join(30)
        for entry, start, end in windows:
            rows.append({**entry, "healthz": healthz_summary(samples, start, end)})
        # Every probe sent while a measured row ran, pooled.
        loaded = [
            s
            for entry, start, end in windows
            if entry["shape"] not in ("warm-up", "at_rest")
            for s in samples
            if start <= s[1] <= end
        ]
        pooled = healthz_summary(loaded, float("-inf"), float("inf"))
        assert served.process.poll() is None, "the server died:\n" + served.log
        baseline = rss_bytes(tree(served.process.pid))
        memory = limit.stats()
    return {
        "memory_cgroup": memory,
        "healthz_during_rows": pooled,
        "rows": rows,
        "rss_after": baseline,
        "shapes": {s.name: s.what for s in SHAPES},
    }


def summarise(rows: list[dict[str, Any]], pooled: dict[str, Any], memory: dict[str, Any]) -> dict[str, Any]:
    measured = [r for r in rows if "answers" in r and r["shape"] not in ("warm-up", "over_max_body")]
    answers = [a for r in measured for a in r["answers"]]
    over = next(r for r in rows if r["shape"] == "over_max_body")
    # Rows with at least 100 probes: in a shorter one the p99 is its slowest probe.
    long_rows = [r for r in measured if r["healthz"]["probes"] >= 100]
    worst = max(long_rows, key=lambda r: r["healthz"]["p99_ms"])
    failed_probes = sum(r["healthz"]["failed"] for r in rows)
    reply = max(a.get("reply_bytes", 0) for a in answers)
    peak = max(r["peak_rss"] for r in [*measured, over])
    peak_pss = max(r["sampled_peak_pss"] for r in [*measured, over])
    largest_body = max(r["body_bytes"] for r in measured)
    # A review refused because the pod already works on as many large bodies as it may (the
    # concurrent rows): the designed answer past the deadline, counted apart.
    busy = [a for a in answers if a.get("http") == 503 and "large bodies" in a.get("error", "")]
    # Time against size: the slower answer's seconds per MiB of body, per shape and size.
    scaling = {}
    for shape in dict.fromkeys(r["shape"] for r in measured):
        mine = sorted((r for r in measured if r["shape"] == shape), key=lambda r: r["body_bytes"])
        per_mib = [max(a["seconds"] for a in r["answers"]) / (r["body_bytes"] / 2**20) for r in mine]
        scaling[shape] = [round(v, 4) for v in per_mib]
    targets = {
        "every_review_answered": all(a.get("http") == 200 or a in busy for a in answers),
        "largest_accepted_body_reached": largest_body >= MAX_BODY - 64 * 1024,
        "over_max_body_is_413": all(a.get("http") == 413 for a in over["answers"]),
        "peak_rss_under_limit": peak < MEMORY_LIMIT,
        # Under the enforced limit nothing was OOM-killed (true where it could not be enforced:
        # the JSON's memory_cgroup says so, and peak_rss_under_limit is then the only check).
        "no_oom_kill_under_enforced_limit": not memory["enforced"] or not memory.get("oom_kills"),
        "healthz_p99_under_100ms": pooled["p99_ms"] < HEALTHZ_P99_MS and failed_probes == 0,
        "reply_bytes_bounded": reply <= REPLY_BOUND,
        # The multiplied delta's pod is a valid one: admitted, within the memory above.
        "multiplied_delta_admitted": all(
            a.get("allowed") for r in rows if r["shape"] == "multiplied_delta" for a in r["answers"]
        ),
        **connections.targets(rows),
    }
    return {
        "reply_bytes": {"max": reply, "bound": REPLY_BOUND},
        "peak_rss": {
            "max_bytes": peak,
            "max_mib": round(peak / 2**20, 1),
            "limit_bytes": MEMORY_LIMIT,
            "how": "sum of VmHWM of the server's processes per row (reset before it): an upper bound "
            "(pages the workers share with the parent count in each)",
            "enforced": memory["enforced"],
            "cgroup_peak_usage_bytes": memory.get("peak_usage_bytes"),
            "cgroup_limit_hit": memory.get("limit_hit"),
            "cgroup_oom_kills": memory.get("oom_kills"),
            "sampled_peak_pss_bytes": peak_pss,
            "sampled_peak_pss_mib": round(peak_pss / 2**20, 1),
        },
        "healthz_p99": {
            "ms": pooled["p99_ms"],
            "target_ms": HEALTHZ_P99_MS,
            "probes": pooled["probes"],
            "max_ms": pooled["max_ms"],
            "failed_probes": failed_probes,
            "how": "every probe sent while a measured row ran, pooled",
            "worst_row": {"shape": worst["shape"], "body_bytes": worst["body_bytes"], **worst["healthz"]},
        },
        "answered_503_busy": len(busy),
        "largest_body_bytes": largest_body,
        "max_body_bytes": MAX_BODY,
        "review_seconds_max": max(a["seconds"] for a in answers),
        "seconds_per_mib_by_size": scaling,
        "targets": targets,
        "pass": all(targets.values()),
    }


def _sizes(args: argparse.Namespace) -> None:
    """The rows' sizes from the command line (module constants the rows read)."""
    global FLOOD, DELTA_FILES
    FLOOD, DELTA_FILES = args.flood, args.delta_files
    connections.CHURN_SECONDS, connections.HOLD_SECONDS = args.churn_seconds, args.hold_seconds
    connections.HELD = args.workers * args.max_connections - 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        type=lambda s: tuple(int(v) for v in s.split(",")),
        default=DEFAULT_SIZES,
        help="body sizes in bytes, comma-separated (default: 64 KiB, 1 MiB, 4 MiB, the max body)",
    )
    parser.add_argument("--workers", type=int, default=2, help="kernelbake admission --workers (deployed: 2)")
    # Smaller runs, for checking that the bench still runs end to end (their JSON is no result).
    parser.add_argument(
        "--max-connections",
        type=int,
        default=MAX_CONNECTIONS,
        help=f"kernelbake admission --max-connections (deployed: {MAX_CONNECTIONS}); the held row "
        "holds one fewer than the workers' places together",
    )
    parser.add_argument("--flood", type=int, default=FLOOD, help=f"silent connections (default {FLOOD})")
    parser.add_argument(
        "--delta-files",
        type=int,
        default=DELTA_FILES,
        help=f"the multiplied delta's files (default {DELTA_FILES})",
    )
    parser.add_argument(
        "--churn-seconds",
        type=float,
        default=connections.CHURN_SECONDS,
        help=f"the churn row's length (default {connections.CHURN_SECONDS:g})",
    )
    parser.add_argument(
        "--hold-seconds",
        type=float,
        default=connections.HOLD_SECONDS,
        help=f"the held row's length (default {connections.HOLD_SECONDS:g})",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    _sizes(args)
    load_before = os.getloadavg()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kb-admission-adversarial-") as tmp:
        measured = run(args, Path(tmp))
    report = {
        "bench": "admission_adversarial",
        "command": "bench/admission_adversarial.py " + " ".join(sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_1_5_15_before": [round(v, 2) for v in load_before],
            "loadavg_1_5_15_after": [round(v, 2) for v in os.getloadavg()],
        },
        "server": f"kernelbake admission --workers {args.workers} (default log level); "
        "each review sent to every worker at once",
        "note": "bench, /healthz prober and server share the CPUs; the server is in a memory cgroup "
        "limited to the deployed 512 MiB where one could be made (memory_cgroup.enforced)",
        "seconds": round(time.monotonic() - started, 1),
        "summary": summarise(measured["rows"], measured["healthz_during_rows"], measured["memory_cgroup"]),
        **measured,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0 if report["summary"]["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
