"""Total deadlines for registry calls.

requests' ``timeout`` bounds each socket operation (the connect, one read), not a request: a
registry that sends one byte every few seconds keeps every read alive and the request forever.
Here one client call (its requests, the token exchange, redirects, the body) is an
``Operation`` with one monotonic deadline. Each request's socket timeouts are what is left of
it, and a watchdog thread shuts down the sockets of an operation that runs past it, which ends
a read wherever it is (connect, TLS handshake, headers, body).

Connections reach the operation of the thread that uses them through a thread-local: requests
runs a request in the calling thread, and the connection classes below are the only place that
sees the socket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import requests.adapters
from urllib3 import HTTPConnectionPool, HTTPSConnectionPool, PoolManager
from urllib3.connection import HTTPConnection, HTTPSConnection

from kernelbake.oci.errors import DeadlineExceeded

Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class Bound:
    """A monotonic time ``at`` by which something must end, and how it was set (for messages)."""

    at: float
    seconds: float
    # Empty for a call's own timeout; else what set it ("verification deadline").
    label: str = ""

    def describe(self) -> str:
        return f"{self.seconds:g}s" + (f" ({self.label})" if self.label else "")


class _Watchdog:
    """One daemon thread for the process: shuts down sockets whose operation ran out of time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Operation]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, op: Operation) -> None:
        with self._cond:
            heapq.heappush(self._heap, (op.bound.at, next(self._order), op))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="kb-registry-deadline", daemon=True)
                self._thread.start()
            self._cond.notify()

    def disarm(self, op: Operation) -> None:
        # Under the lock: once this returns, the watchdog will not touch op's sockets.
        with self._cond:
            op.done = True
            sockets, op.sockets = op.sockets, {}
        for s in sockets.values():
            s.close()

    def _loop(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                at, _, op = self._heap[0]
                delay = at - op.clock()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                heapq.heappop(self._heap)
                op.fired = True
                for s in op.sockets.values():
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)


_WATCHDOG = _Watchdog()
_local = threading.local()


class Operation:
    """One registry call under one deadline; a context manager that makes it the thread's
    current operation and, on the way out, turns any failure past the deadline into
    ``DeadlineExceeded`` naming ``host``, ``what`` and the bound."""

    def __init__(self, bound: Bound, *, host: str, what: str, clock: Clock = time.monotonic) -> None:
        self.bound = bound
        self.host = host
        self.what = what
        self.clock = clock
        # The request in flight: (method, host[:port]), for the message.
        self.request = ("", host)
        self.fired = False
        self.done = False
        # Duplicates of the sockets' descriptors (by original fd): shutting one down ends reads
        # on the original, and the duplicate's lifetime is ours, not the connection pool's.
        self.sockets: dict[int, socket.socket] = {}
        self._outer: Operation | None = None

    def remaining(self) -> float:
        return self.bound.at - self.clock()

    def expired(self) -> bool:
        return self.fired or self.remaining() <= 0

    def exceeded(self) -> DeadlineExceeded:
        method, netloc = self.request
        via = f" (waiting for {netloc})" if netloc != self.host else ""
        return DeadlineExceeded(
            f"{self.host}: {method or 'call'} {self.what} did not finish within {self.bound.describe()}{via}"
        )

    def check(self) -> float:
        """Seconds left; raises ``DeadlineExceeded`` when there are none."""
        left = self.remaining()
        if self.fired or left <= 0:
            raise self.exceeded()
        return left

    def watch(self, sock: Any) -> None:
        fd = sock.fileno()
        if fd < 0 or fd in self.sockets:
            return
        dup = socket.socket(fileno=os.dup(fd))
        with _WATCHDOG._cond:
            if self.done:
                dup.close()
                return
            self.sockets[fd] = dup
            if self.fired:
                with contextlib.suppress(OSError):
                    dup.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Operation:
        self._outer = current_operation()
        _local.op = self
        _WATCHDOG.arm(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        _WATCHDOG.disarm(self)
        _local.op = self._outer
        if isinstance(exc, DeadlineExceeded) or not (exc is None or isinstance(exc, Exception)):
            return
        # After the watchdog cut the connection, whatever came back (an error, or a body cut
        # short that fails its digest) is the deadline's doing.
        if self.fired or (exc is not None and self.remaining() <= 0):
            raise self.exceeded() from None


def current_operation() -> Operation | None:
    op: Operation | None = getattr(_local, "op", None)
    return op


def operation(
    seconds: float, *, host: str, what: str, outer: Bound | None = None, clock: Clock = time.monotonic
) -> Operation:
    """An operation due in ``seconds``, or earlier when ``outer`` or an enclosing operation of
    this thread is due first."""
    bound = Bound(clock() + seconds, seconds)
    for other in (outer, op.bound if (op := current_operation()) else None):
        if other is not None and other.at < bound.at:
            bound = other
    return Operation(bound, host=host, what=what, clock=clock)


class _Watched(HTTPConnection):
    """Hands its socket to the thread's operation: when made, and for each request on a
    connection kept alive from an earlier one."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        if (op := current_operation()) is not None:
            op.watch(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        if self.sock is not None and (op := current_operation()) is not None:
            op.watch(self.sock)
        super().request(*args, **kwargs)


class _WatchedHTTPS(_Watched, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Watched


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPS


_POOLS = {"http": _Pool, "https": _HTTPSPool}


class DeadlineAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter with connections that the thread's operation can cut."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> PoolManager:
        manager: PoolManager = super().proxy_manager_for(proxy, **kwargs)
        manager.pool_classes_by_scheme = _POOLS
        return manager
