"""The HTTPS endpoint the API server calls: ``POST /mutate``, ``POST /validate``, ``GET /healthz``.

HTTP/1.1 and TLS are uvicorn's (with httptools' parser); this module is the ASGI app around
``Admitter`` and the limits a webhook needs that uvicorn leaves to the application:

- a body larger than ``MAX_BODY`` is HTTP 413, a head larger than ``HEADER_LIMIT`` 431
  (httptools has no bound of its own), and the connection closes;
- a worker holds at most ``MAX_CONNECTIONS`` connections, TLS handshakes included, each
  handshake has ``HANDSHAKE_SECONDS`` and reads into a ``TLS_READ_BUFFER`` (asyncio's own
  256 KiB per connection let 2,000 silent connections take a worker past the pod's limit); at
  the limit a new connection takes the place of the one idle longest (``_uvicorn.BoundedTLS``);
- only clients with a certificate ``client_ca`` issued get past the handshake (the API server's);
  without one the server refuses to start unless told ``unsafe_any_client``, and then says so in
  every probe's answer (``clients``);
- the probes have a listener of their own (``health``), which the clients' connections cannot fill;
- a connection has ``IDLE_SECONDS`` to start a request (and between requests), and
  ``HEADER_SECONDS`` to send the whole of one once it started (a stalled client is dropped);
- a review waits for its verifications until the policy's deadline (``Admitter``);
- the bodies larger than ``INLINE_BODY`` that the pod works on at once add up to ``MAX_BODY``
  at most, across its workers (``large_bodies``): a review waits for its share until the
  policy's deadline, else is HTTP 503;
- the event loop never parses or plans a large review itself: a body over ``INLINE_BODY`` is
  decoded, planned and its answer encoded on a worker thread, so one pod spec stuffed with
  thousands of references (each costs linear time, ``kernelbake.oci.reference``) cannot hold
  ``/healthz`` or the other connections;
- a rotated certificate (a mounted Secret updated in place) is loaded without a restart.

Never a crash: broken HTTP gets uvicorn's 400 and the connection closes; a body that is not JSON
gets HTTP 400; anything that parses gets an AdmissionReview answer (``Admitter`` does not raise).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import gc
import logging
import math
import signal
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from pathlib import Path
from typing import Any

import uvicorn

from kernelbake.admission.admit import Endpoint
from kernelbake.admission.bounds import MAX_CONNECTIONS
from kernelbake.admission.http import workers
from kernelbake.admission.http._uvicorn import QuietSignals, bound_tls, bounded_protocol
from kernelbake.admission.http.codec import decode, encode
from kernelbake.admission.http.health import HealthListener
from kernelbake.admission.large_bodies import BodyBudget
from kernelbake.admission.service import Admitter
from kernelbake.errors import BadInput

log = logging.getLogger("kernelbake.admission.server")

# An AdmissionReview carries object and oldObject; etcd caps an object at 1.5 MiB.
MAX_BODY = 8 * 1024 * 1024
HEADER_LIMIT = 64 * 1024
# Bodies up to this size are handled on the event loop (a real pod's review is a few KiB and
# takes well under a millisecond to plan); larger ones on a thread (see the module docstring).
INLINE_BODY = 64 * 1024
IDLE_SECONDS = 120.0
# A client has this long to send a whole request once it started one.
HEADER_SECONDS = 30.0
CERT_CHECK_SECONDS = 60.0
# A handshake takes milliseconds from the API server; asyncio's default waits 60 s.
HANDSHAKE_SECONDS = 10.0
TLS_READ_BUFFER = 32 * 1024
# Connections asyncio accepts in one turn of the loop, and the kernel's queue of connections
# not yet accepted (``listen``'s backlog). uvicorn's default, 2048, let a churn of connections
# that half-close at once make 2,048 connections' objects at a time, for a loop that had
# fallen behind: two workers peaked at 312 MiB each in 10 s (the pod's limit is 512 MiB), and
# 69 MiB with 128, the kernel making the churn wait instead. The API server opens a few.
ACCEPT_BATCH = 128
_ROUTES = {"/mutate": Endpoint.MUTATE, "/validate": Endpoint.VALIDATE}

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class Clients(enum.Enum):
    """Who may connect, as the probes' answers say it."""

    CLIENT_CA = "client-ca"  # only the holders of a certificate the client CA issued
    UNSAFE_ANY_CLIENT = "unsafe-any-client"


def tls_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """The serving context; with ``client_ca``, a client must show a certificate for client
    authentication that it issued (the API server's, from its admission configuration's
    kubeconfig), and one that does not fails its handshake."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class AdmissionServer:
    def __init__(
        self,
        admitter: Admitter,
        *,
        cert: Path,
        key: Path,
        host: str = "0.0.0.0",
        port: int = 8443,
        sock: socket.socket | None = None,
        bodies: BodyBudget | None = None,
        max_connections: int = MAX_CONNECTIONS,
        client_ca: Path | None = None,
        unsafe_any_client: bool = False,
        health_sock: socket.socket | None = None,
    ) -> None:
        if client_ca is None and not unsafe_any_client:
            # Fails closed: serving anyone who reaches the port is asked for by name.
            raise BadInput("the webhook needs a client CA (--client-ca), or --unsafe-any-client")
        self.admitter = admitter
        self.clients = Clients.UNSAFE_ANY_CLIENT if client_ca is None else Clients.CLIENT_CA
        self._about = {"clients": self.clients.value}
        # The probes' listener (``health``), apart from the port clients can fill.
        self.health = None if health_sock is None else HealthListener(health_sock, self._ready, self._about)
        self.max_connections = max_connections
        # Shared by the workers of one pod when the parent made it before forking.
        self.bodies = bodies or BodyBudget(MAX_BODY)
        # A socket already listening (from ``workers.listening_sockets``) wins over host/port.
        self.sock = sock
        self.cert, self.key, self.client_ca = cert, key, client_ca
        self.host, self.port = host, port
        self.tls = tls_context(cert, key, client_ca)
        self._cert_mtimes = self._mtimes()
        self._server: QuietSignals | None = None
        self._serving: asyncio.Task[None] | None = None
        self._reloader: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Listen and return the port (useful with port 0)."""
        sock = self.sock or workers.listening_sockets(self.host, self.port, 1)[0]
        bound_tls(
            limit=self.max_connections,
            handshake_seconds=HANDSHAKE_SECONDS,
            read_buffer=TLS_READ_BUFFER,
            tidy=_tidy,
        )
        config = uvicorn.Config(
            self,
            http=bounded_protocol(idle=IDLE_SECONDS, arriving=HEADER_SECONDS, head_limit=HEADER_LIMIT),
            lifespan="off",
            interface="asgi3",
            # The kernelbake.admission loggers say what matters; a line per request costs
            # more than a cached review.
            access_log=False,
            log_config=None,
            server_header=False,
            # Nothing sits in front of the webhook but the API server: no X-Forwarded-* to trust.
            proxy_headers=False,
            ssl_context_factory=lambda config, default: self.tls,
            timeout_keep_alive=math.ceil(IDLE_SECONDS),
            backlog=ACCEPT_BATCH,
            # Reviews in flight end by the policy's deadline; then the rest is cut.
            timeout_graceful_shutdown=math.ceil(self.admitter.policy.deadline_seconds) + 1,
        )
        self._server = QuietSignals(config)
        self._serving = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._serving.done():
                self._serving.result()
                raise RuntimeError("the HTTPS server stopped while starting")
            await asyncio.sleep(0.01)
        self._reloader = asyncio.create_task(self._watch_certificate())
        if self.health is not None:
            await self.health.start()
        port: int = sock.getsockname()[1]
        return port

    def _ready(self) -> bool:
        return self._server is not None and self._server.started and not self._server.should_exit

    async def serve(self) -> None:
        """Run until SIGTERM/SIGINT, then close gracefully."""
        await self.start()
        # Imports, the catalogue and the policy live as long as the process: keep them out of
        # the garbage collector's full passes, which otherwise show up as latency spikes.
        gc.collect()
        gc.freeze()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        assert self._serving is not None
        await asyncio.wait([asyncio.ensure_future(stop.wait()), self._serving], return_when="FIRST_COMPLETED")
        log.info("stopping: no new connections, finishing reviews in flight")
        await self.close()

    async def close(self) -> None:
        """Stop listening, let reviews in flight end (they end by their deadline), drop idle
        connections, stop the verification pool."""
        if self._reloader is not None:
            self._reloader.cancel()
        if self._server is not None and self._serving is not None:
            self._server.should_exit = True
            await self._serving
        if self.health is not None:
            await self.health.close()
        self.admitter.gateway.close()

    def _mtimes(self) -> tuple[float, ...]:
        files = (self.cert, self.key) if self.client_ca is None else (self.cert, self.key, self.client_ca)
        return tuple(f.stat().st_mtime for f in files)

    async def _watch_certificate(self) -> None:
        # Mounted Secrets are updated in place when the certificate is rotated; new
        # handshakes pick up the new pair without a restart.
        while True:
            await asyncio.sleep(CERT_CHECK_SECONDS)
            self.reload_certificate()

    def reload_certificate(self) -> bool:
        """Load the certificate pair again if a file changed, and a changed client CA: True if
        they were. make-cert.sh rotates the CA with the certificates; the new client CA is added
        to the old one (OpenSSL's store only grows), so the API server's certificate from either
        is taken until the next restart drops the old."""
        try:
            mtimes = self._mtimes()
            if mtimes == self._cert_mtimes:
                return False
            self.tls.load_cert_chain(self.cert, self.key)
            if self.client_ca is not None and mtimes[2:] != self._cert_mtimes[2:]:
                self.tls.load_verify_locations(cafile=self.client_ca)
            self._cert_mtimes = mtimes
            log.info("reloaded the serving certificate %s", self.cert)
            return True
        except (OSError, ssl.SSLError) as exc:
            log.warning("serving certificate not reloaded: %s", exc)
            return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI application: one request, one answer."""
        if scope["type"] != "http":
            return
        started = time.monotonic()
        held = _large(scope)
        deadline = self.admitter.policy.deadline_seconds
        if held and not await self.bodies.wait(held, started + deadline - time.monotonic()):
            status, body, close, held = 503, encode({"error": _BUSY}), True, 0
        else:
            try:
                status, payload, close, large = await self._handle(scope, receive, started)
                body = await asyncio.to_thread(encode, payload) if large else encode(payload)
            finally:
                if held:
                    self.bodies.give(held)
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        if held and _TRIM is not None:
            # After the answer, off the loop: the review's objects are gone by now.
            await asyncio.to_thread(_TRIM, 0)

    async def _handle(self, scope: Scope, receive: Receive, started: float) -> tuple[int, Any, bool, bool]:
        """``(status, payload, close the connection, the body was large)``."""
        version: str = scope["http_version"]
        if not version.startswith("1."):
            # httptools parses any version; the API server speaks HTTP/1.1 to webhooks.
            return 505, {"error": f"HTTP/{version} is not supported"}, True, False
        path: str = scope["path"]
        if path in ("/healthz", "/readyz"):
            return 200, {"status": "ok", **self._about}, False, False
        endpoint = _ROUTES.get(path)
        if endpoint is None:
            return 404, {"error": f"no such endpoint {path!r}; use /mutate or /validate"}, False, False
        method: str = scope["method"]
        if method != "POST":
            return 405, {"error": f"{method} {path}: POST an AdmissionReview"}, False, False
        body = await _body(scope, receive)
        if isinstance(body, tuple):
            return (*body, False)
        large = len(body) > INLINE_BODY
        if large:
            answer = await asyncio.to_thread(self._first_answer, body, endpoint, started)
        else:
            answer = self._first_answer(body, endpoint, started)
        if isinstance(answer, tuple):
            return (*answer, large)
        return 200, answer if isinstance(answer, dict) else await answer, False, large

    def _first_answer(
        self, body: bytes, endpoint: Endpoint, started: float
    ) -> tuple[int, Any, bool] | dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
        """Decode and plan: the answer, the coroutine that waits for verifications (awaited on
        the loop), or an HTTP error for a body that is not JSON."""
        try:
            doc = decode(body)
        except (ValueError, RecursionError) as exc:
            return 400, {"error": f"the body is not JSON: {exc}"}, False
        return self.admitter.review_nowait(doc, endpoint, started=started)


_BUSY = (
    f"the webhook is reviewing as many large bodies as its memory allows (bodies over "
    f"{INLINE_BODY // 1024} KiB add up to {MAX_BODY // 2**20} MiB at most); try again"
)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl).

    A large review's objects are freed when it ends, but the C heap keeps many of their pages:
    without giving them back after each large review, each worker grew to some 180 MiB over
    bench/admission_adversarial.py's 8 MiB bodies (110 MiB with it), and the two workers'
    peak reached 494 MiB of the pod's 512 MiB (424 MiB with it)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_TRIM = _malloc_trim()


def _tidy() -> None:
    """Give back what a churn of closed connections left: objects only a full collection frees
    (asyncio's socket transport holds a bound method of itself; the imports are frozen out of the
    collection, ``serve``), then the C heap's free pages, off the loop. The heap is most of it:
    with the TLS cycles broken, 5,000 connect / half-close loops still left a server 81 MiB above
    its start, 72 MiB after a full collection, 12 MiB after malloc_trim."""
    gc.collect()
    if _TRIM is not None:
        asyncio.get_running_loop().run_in_executor(None, _TRIM, 0)


def _large(scope: Scope) -> int:
    """The bytes a review's body holds while it is reviewed, when it is larger than
    ``INLINE_BODY``; 0 for a smaller one, for anything but a review, and for a body over
    ``MAX_BODY`` (refused unread)."""
    if scope["method"] != "POST" or scope["path"] not in _ROUTES:
        return 0
    # The first content-length, by a loop (a generator here was resumed per header, per request).
    for name, value in scope["headers"]:
        if name == b"content-length":
            declared = int(value)
            return declared if INLINE_BODY < declared <= MAX_BODY else 0
    # Chunked: as large as a body may be.
    return MAX_BODY


async def _body(scope: Scope, receive: Receive) -> bytes | tuple[int, Any, bool]:
    """The request body, or the answer (413, and close) when it is larger than ``MAX_BODY``."""
    too_large = (413, {"error": f"body larger than {MAX_BODY} bytes"}, True)
    for name, value in scope["headers"]:
        # httptools already refused a Content-Length that is not a number.
        if name == b"content-length" and int(value) > MAX_BODY:
            return too_large
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return 400, {"error": "the client hung up"}, True
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
