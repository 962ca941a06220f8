"""The probes' own listener: plain HTTP on a port of its own (``--health-port``).

The kubelet's readiness and liveness probes went to the webhook's HTTPS port, where they waited
in the same accept queue and for the same places as everyone else: 1,023 connections held by one
client made 421 of 421 ``/healthz`` probes fail over 230 s (issue 41), and the kubelet would
have restarted a webhook that was answering the API server's kept-alive connections all along.
Here they have a listener that the webhook's clients never reach (deploy/networkpolicy.yaml
admits the HTTPS port alone), its own places and a short read.

``GET /healthz``: 200 while the worker's event loop answers. ``GET /readyz``: 200 while the
webhook accepts reviews, 503 once it is stopping. Both say who may connect (``clients``:
``client-ca``, or ``unsafe-any-client``), so that a permissive webhook shows in its probes.
Anything else: 404; a request not read whole within ``READ_SECONDS`` or larger than
``HEAD_LIMIT``: the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable, Mapping

# Places per worker: the kubelet sends one probe of each kind per period.
MAX_CONNECTIONS = 16
READ_SECONDS = 2.0
HEAD_LIMIT = 1024


def answer(head: bytes, ready: bool, about: Mapping[str, str] | None = None) -> tuple[int, dict[str, str]]:
    """The status and body for the request whose head is ``head``; ``about``: what the server
    says of itself in each probe's answer."""
    about = about or {}
    method, _, rest = head.partition(b" ")
    path = rest.partition(b" ")[0].partition(b"?")[0]
    if method != b"GET":
        return 405, {"error": "GET /healthz or /readyz"}
    if path == b"/healthz":
        return 200, {"status": "ok", **about}
    if path == b"/readyz":
        return (200, {"status": "ok", **about}) if ready else (503, {"status": "stopping", **about})
    return 404, {"error": "no such endpoint; use /healthz or /readyz"}


_REASONS = {200: b"OK", 404: b"Not Found", 405: b"Method Not Allowed", 503: b"Service Unavailable"}


class HealthListener:
    """Serve the probes on ``sock`` (already listening); ``ready`` says whether reviews are
    accepted."""

    def __init__(
        self, sock: socket.socket, ready: Callable[[], bool], about: Mapping[str, str] | None = None
    ) -> None:
        self.sock = sock
        self.ready = ready
        self.about = dict(about or {})
        self.open = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._client, sock=self.sock, limit=HEAD_LIMIT)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_CONNECTIONS:
            writer.transport.abort()
            return
        self.open += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_SECONDS)
            status, body = answer(head, self.ready(), self.about)
            data = json.dumps(body).encode()
            writer.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s" % (status, _REASONS[status], len(data), data)
            )
            await asyncio.wait_for(writer.drain(), READ_SECONDS)
            writer.close()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.transport.abort()
        finally:
            self.open -= 1
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
