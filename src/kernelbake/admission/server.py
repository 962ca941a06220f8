"""The HTTPS endpoint the API server calls: ``POST /mutate``, ``POST /validate``, ``GET /healthz``.

asyncio streams with TLS and a deliberately small HTTP/1.1 reader (Content-Length or chunked
bodies, keep-alive), because the API server holds connections open and sends many small
requests: one event loop answers cached reviews without a thread hop, and only verifications
go to the gateway's pool. No dependency beyond the standard library.

Never a crash: a body that is not JSON gets HTTP 400; anything that parses gets an
AdmissionReview answer (``Admitter`` does not raise).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import math
import signal
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelbake.admission.admit import Endpoint
from kernelbake.admission.review import Code, Response
from kernelbake.admission.service import Admitter

log = logging.getLogger("kernelbake.admission.server")

# An AdmissionReview carries object and oldObject; etcd caps an object at 1.5 MiB.
MAX_BODY = 8 * 1024 * 1024
HEADER_LIMIT = 64 * 1024
IDLE_SECONDS = 120.0
HEADER_SECONDS = 30.0
CERT_CHECK_SECONDS = 60.0
CLOSE_SECONDS = 5.0
REAP_SECONDS = 1.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    505: "HTTP Version Not Supported",
}
_ROUTES = {"/mutate": Endpoint.MUTATE, "/validate": Endpoint.VALIDATE}


@dataclasses.dataclass(eq=False)
class _Conn:
    transport: asyncio.WriteTransport
    deadline: float
    reaped: bool = False


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
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
        max_inflight: int = 512,
    ) -> None:
        self.admitter = admitter
        self.cert, self.key = cert, key
        self.host, self.port = host, port
        self.tls = tls_context(cert, key)
        self._cert_mtimes = self._mtimes()
        self._slots = asyncio.Semaphore(max_inflight)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._conns: set[_Conn] = set()
        self._reaper: asyncio.Task[None] | None = None
        self._busy = 0
        self._closing = False

    async def start(self) -> int:
        """Bind and return the port (useful with port 0)."""
        self._server = await asyncio.start_server(
            self._connection, self.host, self.port, ssl=self.tls, limit=HEADER_LIMIT, backlog=1024
        )
        self._reaper = asyncio.create_task(self._reap())
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def serve(self, on_ready: Callable[[int], None] | None = None) -> None:
        port = await self.start()
        assert self._server is not None
        # Imports, the catalogue and the policy live as long as the process: keep them out of
        # the garbage collector's full passes, which otherwise show up as latency spikes.
        gc.collect()
        gc.freeze()
        if on_ready:
            on_ready(port)
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
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
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

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)
        # One deadline per connection, enforced by the reaper: cheaper than a timeout around
        # every read, which is most of the cost of a cached review.
        conn = _Conn(writer.transport, time.monotonic() + IDLE_SECONDS)
        self._conns.add(conn)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                except asyncio.LimitOverrunError:
                    await self._send(writer, 431, {"error": "request headers too large"}, close=True)
                    return
                started = time.monotonic()
                conn.deadline = started + HEADER_SECONDS
                self._busy += 1
                try:
                    method, target, headers = _parse_head(head)
                    body = await _read_body(reader, headers)
                    # Reviews end by the policy's deadline on their own.
                    conn.deadline = math.inf
                    status, payload = await self._route(method, target, body, started)
                except _BadRequest as exc:
                    await self._send(writer, exc.status, {"error": exc.message}, close=True)
                    return
                finally:
                    self._busy -= 1
                keep = headers.get("connection", "").lower() != "close"
                await self._send(writer, status, payload, close=not keep)
                if not keep:
                    return
                conn.deadline = time.monotonic() + IDLE_SECONDS
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            return
        except Exception:
            log.exception("connection handler failed")
        finally:
            self._conns.discard(conn)
            if self._closing or conn.reaped:
                # No TLS close_notify exchange on the way out: a peer that does not answer
                # it would hold the shutdown for asyncio's 30 s SSL shutdown timeout.
                writer.transport.abort()
            else:
                writer.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.wait_closed(), CLOSE_SECONDS)

    async def _reap(self) -> None:
        """Drop connections idle past IDLE_SECONDS or stuck sending a request (slow clients)."""
        while True:
            await asyncio.sleep(REAP_SECONDS)
            now = time.monotonic()
            for conn in [c for c in self._conns if c.deadline < now]:
                conn.reaped = True
                conn.transport.abort()

    async def _route(self, method: str, target: str, body: bytes, started: float) -> tuple[int, Any]:
        path = target.split("?", 1)[0]
        if path in ("/healthz", "/readyz"):
            return 200, {"status": "ok"}
        endpoint = _ROUTES.get(path)
        if endpoint is None:
            return 404, {"error": f"no such endpoint {path!r}; use /mutate or /validate"}
        if method != "POST":
            return 405, {"error": f"{method} {path}: POST an AdmissionReview"}
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as exc:
            return 400, {"error": f"the body is not JSON: {exc}"}
        remaining = self.admitter.policy.deadline_seconds - (time.monotonic() - started)
        try:
            if self._slots.locked():
                async with asyncio.timeout(max(0.0, remaining)):
                    await self._slots.acquire()
            else:
                await self._slots.acquire()
        except TimeoutError:
            busy = Response(
                uid=_uid(doc),
                allowed=False,
                code=Code.UNAVAILABLE,
                message="kernelbake admission: too many reviews in flight; try again",
            )
            return 200, busy.to_document()
        try:
            return 200, await self.admitter.review_async(doc, endpoint, started=started)
        finally:
            self._slots.release()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, status: int, payload: Any, *, close: bool) -> None:
        body = json.dumps(payload, separators=(",", ":")).encode()
        reason = _REASONS.get(status, "Error")
        extra = "Connection: close\r\n" if close else ""
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise _BadRequest(400, "malformed request line") from None
    if not version.startswith("HTTP/1."):
        raise _BadRequest(505, f"{version} is not supported")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise _BadRequest(400, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    return method, target, headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _read_chunked(reader)
    length = headers.get("content-length", "0")
    if not length.isdigit():
        raise _BadRequest(400, "Content-Length is not a number")
    if int(length) > MAX_BODY:
        raise _BadRequest(413, f"body larger than {MAX_BODY} bytes")
    return await reader.readexactly(int(length))


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        size_line = await reader.readuntil(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _BadRequest(400, "malformed chunk size") from None
        if size == 0:
            # Trailers end with an empty line.
            while (await reader.readuntil(b"\r\n")) != b"\r\n":
                pass
            return b"".join(chunks)
        total += size
        if total > MAX_BODY:
            raise _BadRequest(413, f"body larger than {MAX_BODY} bytes")
        chunks.append(await reader.readexactly(size))
        await reader.readexactly(2)


def _uid(doc: Any) -> str:
    request = doc.get("request") if isinstance(doc, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) else ""
