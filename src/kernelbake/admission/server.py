"""The HTTPS endpoint the API server calls: ``POST /mutate``, ``POST /validate``, ``GET /healthz``.

An ``asyncio.Protocol`` per connection over TLS, with the small HTTP/1.1 reader in ``http``:
the API server keeps connections open and sends many small requests, and a cached review is
answered inside ``data_received`` (no task, no thread hop, no stream machinery). Only reviews
that must wait for a verification become a task, bounded by ``max_inflight``; verifications run
on the gateway's pool. No dependency beyond the standard library.

Never a crash: broken HTTP gets its 4xx and the connection closes; a body that is not JSON gets
HTTP 400; anything that parses gets an AdmissionReview answer (``Admitter`` does not raise).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import signal
import socket
import ssl
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from kernelbake.admission import http
from kernelbake.admission.admit import Endpoint
from kernelbake.admission.service import Admitter

log = logging.getLogger("kernelbake.admission.server")

IDLE_SECONDS = 120.0
# A client has this long to send a whole request once it started one.
HEADER_SECONDS = 30.0
CERT_CHECK_SECONDS = 60.0
REAP_SECONDS = 1.0
_ROUTES = {"/mutate": Endpoint.MUTATE, "/validate": Endpoint.VALIDATE}

Answer = tuple[int, Any]


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


class _Connection(asyncio.Protocol):
    """One client connection: requests answered in order, one at a time."""

    def __init__(self, server: AdmissionServer) -> None:
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        self.paused = False
        self.closing = False
        # When the reaper drops this connection; one deadline instead of a timer per read.
        self.deadline = math.inf
        self.started = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.deadline = time.monotonic() + IDLE_SECONDS
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.closing = True
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        if not self.buf:
            self.started = time.monotonic()
            if self.task is None:
                self.deadline = self.started + HEADER_SECONDS
        self.buf += data
        if len(self.buf) > http.MAX_BODY + http.HEADER_LIMIT and self.transport is not None:
            # A client piling up requests behind one that waits for the registry.
            self.transport.pause_reading()
        try:
            self._next()
        except Exception:
            log.exception("connection handler failed")
            self.abort()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._next()

    def abort(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.abort()

    def _next(self) -> None:
        while self.buf and self.task is None and not self.paused and not self.closing:
            try:
                parsed = http.parse_request(self.buf)
            except http.BadRequest as exc:
                self._reply((exc.status, {"error": exc.message}), close=True)
                return
            if parsed is None:
                return
            request, used = parsed
            del self.buf[:used]
            answer = self.server.handle(request, self.started)
            self.started = time.monotonic()
            if isinstance(answer, tuple):
                self._reply(answer, close=not request.keep_alive)
            else:
                # Reviews end by the policy's deadline on their own.
                self.deadline = math.inf
                self.task = asyncio.get_running_loop().create_task(self._finish(answer, request.keep_alive))
                return
        if self.task is None and self.transport is not None and not self.closing:
            if not self.buf:
                self.deadline = time.monotonic() + IDLE_SECONDS
            if not self.transport.is_reading():
                self.transport.resume_reading()

    async def _finish(self, pending: Coroutine[Any, Any, Answer], keep_alive: bool) -> None:
        try:
            answer = await pending
        except Exception:
            log.exception("a review failed")
            self.abort()
            return
        self.task = None
        if not self.closing:
            self._reply(answer, close=not keep_alive)
            self._next()

    def _reply(self, answer: Answer, *, close: bool) -> None:
        if self.transport is None or self.closing:
            return
        self.transport.write(http.response(*answer, close=close))
        if close:
            self.closing = True
            self.transport.close()


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
    ) -> None:
        self.admitter = admitter
        # A socket already listening (from ``workers.listening_sockets``) wins over host/port.
        self.sock = sock
        self.cert, self.key = cert, key
        self.host, self.port = host, port
        self.tls = tls_context(cert, key)
        self._cert_mtimes = self._mtimes()
        self._server: asyncio.Server | None = None
        self.connections: set[_Connection] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._busy = 0

    async def start(self) -> int:
        """Bind and return the port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        if self.sock is not None:
            self._server = await loop.create_server(lambda: _Connection(self), sock=self.sock, ssl=self.tls)
        else:
            self._server = await loop.create_server(
                lambda: _Connection(self), self.host, self.port, ssl=self.tls, backlog=1024
            )
        self._reaper = asyncio.create_task(self._reap())
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def serve(self) -> None:
        """Run until SIGTERM/SIGINT, then close gracefully."""
        await self.start()
        assert self._server is not None
        # Imports, the catalogue and the policy live as long as the process: keep them out of
        # the garbage collector's full passes, which otherwise show up as latency spikes.
        gc.collect()
        gc.freeze()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        reloader = asyncio.create_task(self._watch_certificate())
        await stop.wait()
        log.info("stopping: no new connections, finishing reviews in flight")
        reloader.cancel()
        await self.close()

    async def close(self) -> None:
        """Stop listening, let reviews in flight end (they end by their deadline), drop idle
        connections, stop the verification pool."""
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + self.admitter.policy.deadline_seconds
        while self._busy and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._reaper is not None:
            self._reaper.cancel()
        # No TLS close_notify exchange on the way out: a peer that does not answer it would
        # hold the shutdown for asyncio's 30 s SSL shutdown timeout.
        for conn in list(self.connections):
            conn.abort()
        self.admitter.gateway.close()

    def _mtimes(self) -> tuple[float, float]:
        return (self.cert.stat().st_mtime, self.key.stat().st_mtime)

    async def _watch_certificate(self) -> None:
        # Mounted Secrets are updated in place when the certificate is rotated; new
        # handshakes pick up the new pair without a restart.
        while True:
            await asyncio.sleep(CERT_CHECK_SECONDS)
            try:
                mtimes = self._mtimes()
                if mtimes != self._cert_mtimes:
                    self.tls.load_cert_chain(self.cert, self.key)
                    self._cert_mtimes = mtimes
                    log.info("reloaded the serving certificate %s", self.cert)
            except (OSError, ssl.SSLError) as exc:
                log.warning("serving certificate not reloaded: %s", exc)

    async def _reap(self) -> None:
        """Drop connections idle past IDLE_SECONDS or slow to send a request they started."""
        while True:
            await asyncio.sleep(REAP_SECONDS)
            now = time.monotonic()
            for conn in [c for c in self.connections if c.deadline < now]:
                conn.abort()

    def handle(self, request: http.Request, started: float) -> Answer | Coroutine[Any, Any, Answer]:
        """The answer now, or a coroutine when a review has to wait for a verification."""
        path = request.path
        if path in ("/healthz", "/readyz"):
            return 200, {"status": "ok"}
        endpoint = _ROUTES.get(path)
        if endpoint is None:
            return 404, {"error": f"no such endpoint {path!r}; use /mutate or /validate"}
        if request.method != "POST":
            return 405, {"error": f"{request.method} {path}: POST an AdmissionReview"}
        try:
            doc = json.loads(request.body)
        except (ValueError, RecursionError) as exc:
            return 400, {"error": f"the body is not JSON: {exc}"}
        answer = self.admitter.review_nowait(doc, endpoint, started=started)
        if isinstance(answer, dict):
            return 200, answer
        return self._waiting(answer)

    async def _waiting(self, review: Coroutine[Any, Any, dict[str, Any]]) -> Answer:
        self._busy += 1
        try:
            return 200, await review
        finally:
            self._busy -= 1
