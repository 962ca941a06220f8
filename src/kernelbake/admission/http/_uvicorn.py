"""Everything kernelbake takes from uvicorn (and asyncio's TLS) beyond their public API, in one place.

uvicorn is the webhook's HTTP/1.1 and TLS server, but the bounds a webhook needs (time before
and during a request, the size of a request's head) are not among its options, and neither is
writing a response in one TLS record. They are kept here by subclassing its httptools protocol,
a private class: pyproject pins uvicorn to one minor release, and
``tests/admission/test_uvicorn_seam.py`` names the private surface used so that a release
that moves it fails there, with the name, rather than somewhere in the server tests.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import enum
import json
import logging
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# What BoundedProtocol uses of HttpToolsProtocol besides the public asyncio.Protocol methods:
# the callbacks it extends and the attributes it reads (the seam test checks each).
PRIVATE_CALLBACKS = (
    "on_message_begin",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "shutdown",
)
PRIVATE_ATTRIBUTES = ("loop", "transport", "cycle", "url", "headers", "parser")


class Corked(asyncio.Transport):
    """A connection's transport whose writes within one turn of the event loop go out as one.

    uvicorn writes a response's head and body separately; over TLS each write is a record and
    a send(2) (asyncio sends at once, with TCP_NODELAY), and the second send cost as much as the
    whole review. Everything uvicorn calls on its transport is passed through."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending.clear()
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(map(len, self._pending))


class Waiting(enum.IntEnum):
    """What a connection without a request in flight waits for, in the order they give their
    places up to new connections (``BoundedTLS``)."""

    HANDSHAKE = 0
    CONNECTED = 1  # handshake done, no request yet
    KEPT_ALIVE = 2  # answered, waiting for its next request
    ARRIVING = 3  # a request begun and not whole yet


class BoundedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds it does not keep: time before the first
    request (uvicorn's keep-alive timer only runs between requests), time while a request is
    arriving (a client that sends a few bytes and stalls would otherwise hold its connection),
    and the size of a request's head (httptools buffers a header line of any length)."""

    # Set by ``bounded_protocol`` (uvicorn constructs the protocol itself, so the bounds travel
    # as class attributes).
    idle_seconds: float = 120.0
    arriving_seconds: float = 30.0
    head_limit: int = 64 * 1024
    _timer: asyncio.TimerHandle | None = None
    # Bytes of the request head read so far; None while a body is arriving or being answered.
    _head: int | None = 0
    _refused = False
    # The TLS connection under this one (set by BoundedTLS), told when a request is in flight.
    holder: BoundedTLS | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(Corked(transport, self.loop))
        self._arm(self.idle_seconds)
        if self.holder is not None:
            self.holder.waits(Waiting.CONNECTED)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.holder = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._head is not None:
            # Counted before the parser sees it; a head completed in this chunk resets it.
            self._head += len(data)
        super().data_received(data)
        if not self._refused and self._head is not None and self._head > self.head_limit:
            self._refuse_head()

    def on_message_begin(self) -> None:
        self._arm(self.arriving_seconds)
        if self.holder is not None:
            self.holder.waits(Waiting.ARRIVING)
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head = None
        # A head that arrived in one read is only seen whole here.
        # A loop, not sum() over a generator resumed per header: every request passes here.
        size = len(self.url)
        for name, value in self.headers:
            size += len(name) + len(value) + 4
        if size > self.head_limit:
            self._refuse_head()
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        # From here the review's own deadline applies, then uvicorn's keep-alive timer.
        self._disarm()
        self._head = 0
        if self.holder is not None:
            self.holder.busy()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.holder is not None and not self.transport.is_closing():
            self.holder.waits(Waiting.KEPT_ALIVE)

    def _refuse_head(self) -> None:
        """431 for a head over ``head_limit``, counted as it arrives (``data_received``) or,
        when it came in one read, once parsed. Like uvicorn's own answer to a request it cannot
        parse: a fixed response, then close."""
        self._refused = True
        body = json.dumps({"error": f"request head larger than {self.head_limit} bytes"}).encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self.transport.close()

    def shutdown(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            # No TLS close_notify exchange on the way out: a peer that does not answer it
            # would hold the shutdown for asyncio's 30 s SSL shutdown timeout.
            self.transport.abort()
        else:
            super().shutdown()

    def forget(self) -> None:
        """Drop the parser (which holds this protocol's callbacks) of a protocol whose
        connection ended before it was made: nothing else frees the pair but a full collection."""
        self.parser = None  # type: ignore[assignment]
        self.holder = None

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self.transport.abort)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


log = logging.getLogger("kernelbake.admission.server")


class BoundedTLS(asyncio.sslproto.SSLProtocol):
    """asyncio's TLS protocol with the bounds a webhook needs before any request exists.

    Every accepted connection gets one of these at once, before its handshake, and asyncio
    gives each a 256 KiB read buffer: 2,000 connections that send nothing took a worker from
    52 to 649 MiB, past the pod's 512 MiB, and uvicorn has no bound on connections (its
    ``limit_concurrency`` counts requests, which such connections never start). Here each
    worker holds at most ``limit`` connections, handshakes included, a handshake has ``handshake_seconds``
    (asyncio's default is 60), and the read buffer is ``read_buffer`` bytes (a TLS record is
    at most 16 KiB, so a smaller buffer only means more, smaller reads).

    At the limit a new connection takes the place of one without a request in flight: the one
    that has waited longest of the first ``Waiting`` kind that has one to give (still in its
    handshake, then connected without a request, both only once they have waited
    ``GRACE_SECONDS``; then kept alive since its last answer; then still sending a request, these
    two only while connections without a request hold less than half the places: ``_victim``),
    at most ``EVICTIONS_PER_SECOND`` a second. A review being answered is never cut (it ends by
    its deadline); when there is none to cut, the new connection is dropped before its
    handshake. Both are logged. Without this, 1,023 connections that each sent a tiny request
    every 100 s made every new connection fail; in this order, a flood of connections that never
    finish a handshake cuts none of the API server's kept-alive ones, nor a review on its way in,
    and a holder that reconnects at once, its new connection younger than the grace, keeps no
    newcomer out.

    A connection that never gets to a request (dropped, or its handshake failed: a client that
    connects and half-closes) must cost nothing once it is gone. Two reference cycles kept each
    one's objects (the TLS object and its buffers, both protocols) until the garbage collector's
    next full pass, and the C heap kept their pages after it: 181,669 such connections in 40 s
    took a worker from 45 to 250 MiB, and it stayed there. Both cycles are broken where they form
    (``_wakeup_waiter``, ``connection_lost``), and after every ``TIDY_EVERY`` closed connections
    ``tidy`` runs ``TIDY_SECONDS`` later (once per such stretch, however long the churn goes on)."""

    # Set by ``bound_tls`` (asyncio constructs the protocol itself).
    max_size: ClassVar[int] = 32 * 1024  # asyncio's name for the read buffer's size
    limit: ClassVar[int] = 512
    handshake_seconds: ClassVar[float] = 10.0
    live: ClassVar[weakref.WeakSet[BoundedTLS]] = weakref.WeakSet()
    # The live connections without a request in flight, by Waiting kind, the one that has
    # waited longest first: the next to give its place up (``_evict``). Dicts keep their order.
    waiting: ClassVar[tuple[dict[BoundedTLS, float], ...]] = tuple({} for _ in Waiting)
    # A connection in its handshake or without a request yet gives its place up only after
    # this long: the API server's take milliseconds, and cutting a younger one for a newer one
    # gains nothing. Under a churn they were all younger, and each newcomer taking a place
    # (a TLS object and its buffers) instead of being dropped took a worker to 360 MiB.
    GRACE_SECONDS: ClassVar[float] = 1.0
    EVICTIONS_PER_SECOND: ClassVar[int] = 128
    _window: ClassVar[float] = 0.0
    _cuts: ClassVar[int] = 0
    _kind: Waiting | None = None
    dropped: ClassVar[int] = 0
    evicted: ClassVar[int] = 0
    _said: ClassVar[float] = 0.0
    _said_evicted: ClassVar[float] = 0.0
    _raw: asyncio.Transport | None = None
    _cut = False
    # In ``live``: asked twice a request (``waits``), where the WeakSet's own membership test
    # makes a weak reference and a Python call each time (141 ns, against 7 for this flag).
    _counted = False
    # Run (on the loop) after ``TIDY_EVERY`` connections closed, at most every ``TIDY_SECONDS``:
    # what the cycle collector and the C heap still hold of them is given back (``bound_tls``).
    # An API server keeps its connections, so a webhook it alone talks to never runs it.
    tidy: ClassVar[Callable[[], None] | None] = None
    TIDY_EVERY: ClassVar[int] = 64
    TIDY_SECONDS: ClassVar[float] = 1.0
    closed: ClassVar[int] = 0
    _tidying: ClassVar[asyncio.TimerHandle | None] = None

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        app_protocol: asyncio.BaseProtocol,
        sslcontext: Any,
        waiter: asyncio.Future[Any],
        server_side: bool = False,
        server_hostname: str | None = None,
        call_connection_made: bool = True,
        ssl_handshake_timeout: int | None = None,
        ssl_shutdown_timeout: int | None = None,
    ) -> None:
        # Decided before asyncio allocates the read buffer, which a dropped connection never uses.
        self._drop = server_side and len(BoundedTLS.live) >= self.limit and not _evict()
        if self._drop:
            self.max_size = 1  # type: ignore[misc]
        if server_side:
            seconds = min(ssl_handshake_timeout or self.handshake_seconds, self.handshake_seconds)
            ssl_handshake_timeout = max(1, int(seconds))
        super().__init__(
            loop,
            app_protocol,
            sslcontext,
            waiter,
            server_side,
            server_hostname,
            call_connection_made=call_connection_made,
            ssl_handshake_timeout=ssl_handshake_timeout,
            ssl_shutdown_timeout=ssl_shutdown_timeout,
        )
        if server_side and not self._drop:
            BoundedTLS.live.add(self)
            self._counted = True
            self.waits(Waiting.HANDSHAKE)
            if isinstance(app_protocol, BoundedProtocol):
                app_protocol.holder = self

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self._drop:
            BoundedTLS.dropped += 1
            now = time.monotonic()
            if now - BoundedTLS._said >= 10:
                BoundedTLS._said = now
                log.warning(
                    "dropped a connection before its TLS handshake: this worker holds %d, the "
                    "limit (--max-connections), none it may cut (a review in flight on each, or "
                    "connections younger than %g s without a request on half); %d dropped so far",
                    self.limit,
                    BoundedTLS.GRACE_SECONDS,
                    BoundedTLS.dropped,
                )
            # Nothing was read and no handshake started: the socket is closed at once.
            transport.abort()
            return
        self._raw = transport
        if self._cut:
            # Cut for a newer one before asyncio got to start its handshake.
            transport.abort()
            return
        super().connection_made(transport)

    def busy(self) -> None:
        """A request arrived whole: its review is not to be cut for a newcomer."""
        if self._kind is not None:
            BoundedTLS.waiting[self._kind].pop(self, None)
            self._kind = None

    def waits(self, kind: Waiting) -> None:
        """No request in flight from now, of this kind: the newest of its kind to give way."""
        self.busy()
        if self._counted:
            BoundedTLS.waiting[kind][self] = time.monotonic()
            self._kind = kind

    def connection_lost(self, exc: BaseException | None) -> None:
        BoundedTLS.live.discard(self)
        self._counted = False
        self.busy()
        app = self._app_protocol
        never_connected = self._app_state is asyncio.sslproto.AppProtocolState.STATE_INIT  # type: ignore[attr-defined]
        super().connection_lost(exc)
        if never_connected and isinstance(app, BoundedProtocol):
            # uvicorn breaks its protocol's cycle with its parser in connection_lost, which a
            # protocol whose connection never got past TLS is never given.
            app.forget()
        self._closed_one()

    def _wakeup_waiter(self, exc: BaseException | None = None) -> None:
        # The server side's waiter is awaited by asyncio's accept coroutine alone, which closes
        # the transport on an exception (already closed here) and otherwise does nothing. In
        # Python 3.11 that exception keeps its traceback, the traceback the coroutine's frame
        # and the frame the waiter that holds the exception: a cycle per failed handshake
        # (CPython gh-109534, fixed in 3.12.1). Waking it without one leaves none.
        super()._wakeup_waiter(None if self._server_side else exc)

    def _closed_one(self) -> None:
        BoundedTLS.closed += 1
        if BoundedTLS.tidy is None or BoundedTLS.closed < BoundedTLS.TIDY_EVERY:
            return
        if BoundedTLS._tidying is not None:
            # One at a time: it covers every connection closed until it runs.
            return
        BoundedTLS._tidying = self._loop.call_later(BoundedTLS.TIDY_SECONDS, _run_tidy)


def _evict() -> bool:
    """Cut a waiting connection to make room for a new one (see ``BoundedTLS``); False when
    there is none to cut (``_victim``) or this second's ``EVICTIONS_PER_SECOND`` are spent (each
    cut connection's objects live until the loop's next turn, beside the new one's: under a
    churn, cutting for every newcomer took a worker from 176 to 260 MiB)."""
    now = time.monotonic()
    if now - BoundedTLS._window >= 1:
        BoundedTLS._window, BoundedTLS._cuts = now, 0
    if BoundedTLS._cuts >= BoundedTLS.EVICTIONS_PER_SECOND:
        return False
    victim = _victim(now)
    if victim is None:
        return False
    BoundedTLS._cuts += 1
    victim.busy()
    BoundedTLS.live.discard(victim)
    victim._counted = False
    victim._cut = True
    if victim._raw is not None:
        victim._raw.abort()
    BoundedTLS.evicted += 1
    if now - BoundedTLS._said_evicted >= 10:
        BoundedTLS._said_evicted = now
        log.warning(
            "cut a waiting connection (in its handshake, idle, or slow to send a request) for a "
            "new one: this worker holds %d, the limit (--max-connections); %d cut so far",
            BoundedTLS.limit,
            BoundedTLS.evicted,
        )
    return True


def _victim(now: float) -> BoundedTLS | None:
    """The connection a newcomer takes the place of: the longest waiting of the first kind that
    has one to give. A connection without a request yet gives its place up only once it has
    waited ``GRACE_SECONDS``; a younger one is passed over, not a reason to drop the newcomer
    (a holder reconnecting at once kept one in its handshake, and a fresh connection then found
    no place with 63 of 64 kept alive). Kept-alive and arriving connections give way only while
    those without a request hold less than half the places: a flood of handshakes never takes
    the API server's kept-alive connections, and a few newcomers never block them."""
    waiting = BoundedTLS.waiting
    for kind in (Waiting.HANDSHAKE, Waiting.CONNECTED):
        if waiting[kind]:
            oldest, since = next(iter(waiting[kind].items()))
            if now - since >= BoundedTLS.GRACE_SECONDS:
                return oldest
    if 2 * (len(waiting[Waiting.HANDSHAKE]) + len(waiting[Waiting.CONNECTED])) >= BoundedTLS.limit:
        return None
    for kind in (Waiting.KEPT_ALIVE, Waiting.ARRIVING):
        if waiting[kind]:
            return next(iter(waiting[kind]))
    return None


def _run_tidy() -> None:
    BoundedTLS.closed = 0
    BoundedTLS._tidying = None
    if BoundedTLS.tidy is not None:
        BoundedTLS.tidy()


def bound_tls(
    *, limit: int, handshake_seconds: float, read_buffer: int, tidy: Callable[[], None] | None = None
) -> None:
    """Make every TLS connection this process accepts a ``BoundedTLS`` with these bounds, and
    ``tidy`` what closed connections leave (see there). asyncio looks ``sslproto.SSLProtocol``
    up when it accepts a connection, so the class is replaced there; the webhook's process
    serves nothing else."""
    BoundedTLS.limit = limit
    BoundedTLS.handshake_seconds = handshake_seconds
    BoundedTLS.max_size = read_buffer
    BoundedTLS.tidy = tidy
    asyncio.sslproto.SSLProtocol = BoundedTLS  # type: ignore[misc,assignment]


class QuietSignals(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # SIGTERM/SIGINT are AdmissionServer.serve's: uvicorn's own handlers re-raise the
        # signal after the graceful stop, so a worker would die by it instead of exiting 0.
        yield


def bounded_protocol(*, idle: float, arriving: float, head_limit: int) -> type[BoundedProtocol]:
    """The protocol class to hand uvicorn (``uvicorn.Config(http=…)``) with these bounds."""
    return type(
        "BoundedProtocol",
        (BoundedProtocol,),
        {"idle_seconds": idle, "arriving_seconds": arriving, "head_limit": head_limit},
    )
