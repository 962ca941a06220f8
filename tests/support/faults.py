"""Registries that fail, for tests and bench/faults.py: a loopback proxy in front of the real
docker-registry that forwards every request except those a rule picks, which it answers with
an error status, or by hanging, dripping, resetting the connection, cutting the body short or
serving other content than the digest asked for. And a port that accepts connections at the
kernel and never answers.

Nothing here sleeps past the proxy's life: hanging and dripping handlers stop when it closes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import socket
import struct
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class Reply:
    """Answer with this instead of the registry's answer."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Hang:
    """Read the request, never answer."""


@dataclasses.dataclass(frozen=True)
class Reset:
    """Read the request, then reset the connection (RST, no answer)."""


@dataclasses.dataclass(frozen=True)
class Drip:
    """Send the registry's answer (or ``reply``) one byte every ``every`` seconds: from the
    status line on, or (``body_only``) headers at once and then the body."""

    every: float
    body_only: bool = False
    reply: Reply | None = None


@dataclasses.dataclass(frozen=True)
class Truncate:
    """Forward the headers (with the full Content-Length) and the first ``keep`` of the body,
    then close the connection."""

    keep: float = 0.5


@dataclasses.dataclass(frozen=True)
class Substitute:
    """Forward the registry's status and headers with ``body`` in place of its body."""

    body: bytes


Action = Reply | Hang | Reset | Drip | Truncate | Substitute
# (method, path) -> a status or an action instead of plain forwarding, or None to forward.
Rule = Callable[[str, str], "int | Action | None"]
# (method, path, upstream body) -> headers to add to / body to substitute in the forwarded answer.
Edit = Callable[[str, str, bytes], "tuple[dict[str, str], bytes]"]

_ERROR_BODY = b'{"errors":[{"code":"UNKNOWN","message":"injected failure"}]}'
_HOP_BY_HOP = ("content-length", "transfer-encoding", "connection")


@dataclasses.dataclass
class Proxy:
    address: str  # 127.0.0.1:<port>
    # How many requests a rule answered with something other than forwarding.
    faulted: int = 0
    requests: int = 0


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What every handler of one ``proxy`` shares."""

    upstream: str
    rule: Rule
    edit: Edit | None
    state: Proxy
    stopping: threading.Event
    lock: threading.Lock


class _Handler(BaseHTTPRequestHandler):
    shared: ClassVar[_Setup]

    def _handle(self) -> None:
        answer = self._ask_rule()
        if not self._answer_alone(answer):
            self._forward(answer)

    def _ask_rule(self) -> Action | None:
        shared = self.shared
        with shared.lock:
            shared.state.requests += 1
        answer = shared.rule(self.command, self.path)
        if isinstance(answer, int):
            answer = Reply(answer, _ERROR_BODY)
        if answer is not None:
            with shared.lock:
                shared.state.faulted += 1
        return answer

    def _answer_alone(self, answer: Action | None) -> bool:
        """Answer without asking the registry, where the action says so; whether it did."""
        if isinstance(answer, Hang):
            self.shared.stopping.wait()
        elif isinstance(answer, Reset):
            # SO_LINGER 0: close() sends RST instead of FIN.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        elif isinstance(answer, Reply):
            self.wfile.write(self._reply(answer))
        elif isinstance(answer, Drip) and answer.reply is not None:
            self._drip(answer, self._reply(answer.reply))
        else:
            return False
        return True

    def _forward(self, answer: Action | None) -> None:
        """The registry's answer, edited, substituted, cut short or dripped as the action says."""
        status, headers, body = self._upstream()
        edit = self.shared.edit
        if isinstance(answer, Substitute):
            body = answer.body
        elif edit is not None:
            extra, body = edit(self.command, self.path, body)
            headers += list(extra.items())
        head = self._head(status, headers, len(body))
        if self.command == "HEAD":
            self.wfile.write(head)
        elif isinstance(answer, Truncate):
            self.wfile.write(head + body[: int(len(body) * answer.keep)])
            self.connection.shutdown(socket.SHUT_WR)
        elif isinstance(answer, Drip):
            if answer.body_only:
                self.wfile.write(head)
            self._drip(answer, body if answer.body_only else head + body)
        else:
            self.wfile.write(head + body)

    def _upstream(self) -> tuple[int, list[tuple[str, str]], bytes]:
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        req = urllib.request.Request(
            f"http://{self.shared.upstream}{self.path}", data=data, headers=headers, method=self.command
        )
        try:
            resp = urllib.request.urlopen(req, timeout=10)
        except urllib.error.HTTPError as err:
            resp = err
        with resp:
            body = resp.read()
            kept = [(k, v) for k, v in resp.headers.items() if k.lower() not in _HOP_BY_HOP]
            return resp.status, kept, body

    def _head(self, status: int, headers: list[tuple[str, str]], length: int) -> bytes:
        lines = [f"HTTP/1.0 {status} {self.responses.get(status, ('',))[0]}"]
        lines += [f"{k}: {v}" for k, v in headers]
        lines += [f"Content-Length: {length}", "Connection: close", "", ""]
        return "\r\n".join(lines).encode("latin-1")

    def _reply(self, reply: Reply) -> bytes:
        headers = {"Content-Type": "application/json", **reply.headers}
        return self._head(reply.status, list(headers.items()), len(reply.body)) + reply.body

    def _drip(self, drip: Drip, data: bytes) -> None:
        for i in range(len(data)):
            if self.shared.stopping.wait(drip.every):
                return
            self.wfile.write(data[i : i + 1])

    # A client that gave up (the point of most faults) closes its end: not an error.
    def handle_one_request(self) -> None:
        with contextlib.suppress(OSError):
            super().handle_one_request()

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()

    do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def proxy(upstream: str, rule: Rule, edit: Edit | None = None) -> Iterator[Proxy]:
    """A proxy forwarding to ``upstream`` (``host:port``) except where ``rule`` answers;
    ``edit`` may add headers to or change the body of forwarded answers."""
    stopping = threading.Event()
    state = Proxy("")
    setup = _Setup(upstream, rule, edit, state, stopping, threading.Lock())
    handler = type("Handler", (_Handler,), {"shared": setup})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.address = f"127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        stopping.set()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def fault_proxy(upstream: str, rule: Rule, edit: Edit | None = None) -> Iterator[str]:
    """``127.0.0.1:<port>`` of a ``proxy`` (for tests that need only the address)."""
    with proxy(upstream, rule, edit) as p:
        yield p.address


class Fault(enum.Enum):
    """The faults the tests and the bench inject, each into every read of registry content."""

    SERVER_ERROR = "5xx"
    HANG = "hang"
    DRIP = "drip"
    DRIP_BODY = "drip-body"
    RESET = "reset"
    TRUNCATE = "truncate"
    WRONG_DIGEST = "wrong-digest"


def _reads_content(method: str, path: str) -> bool:
    return method in ("GET", "HEAD") and ("/manifests/" in path or "/blobs/" in path)


def fault_rule(fault: Fault, *, drip_every: float = 0.25, substitute: bytes = b"") -> Rule:
    """The rule that injects ``fault`` into every manifest and blob read; ``WRONG_DIGEST``
    answers manifests asked for by digest with ``substitute`` (another manifest)."""
    action: Action = {
        Fault.SERVER_ERROR: Reply(503, _ERROR_BODY),
        Fault.HANG: Hang(),
        Fault.DRIP: Drip(drip_every),
        Fault.DRIP_BODY: Drip(drip_every, body_only=True),
        Fault.RESET: Reset(),
        Fault.TRUNCATE: Truncate(),
        Fault.WRONG_DIGEST: Substitute(substitute),
    }[fault]

    def rule(method: str, path: str) -> Action | None:
        if fault is Fault.WRONG_DIGEST:
            return action if method == "GET" and "/manifests/sha256:" in path else None
        return action if _reads_content(method, path) else None

    return rule


@contextlib.contextmanager
def silent_registry() -> Iterator[str]:
    """A port whose kernel accepts the TCP connection (backlog) but where nothing ever answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()
