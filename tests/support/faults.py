"""Registries that fail: a proxy in front of the real one that answers chosen requests with an
error status, and a port that accepts connections and never answers."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    headers: dict[str, str] = dataclasses.field(default_factory=dict)


# (method, path) -> a status or a full reply to answer instead of the registry, or None to forward.
Rule = Callable[[str, str], "int | Reply | None"]
# (method, path, upstream body) -> headers to add to / body to substitute in the forwarded answer.
Edit = Callable[[str, str, bytes], "tuple[dict[str, str], bytes]"]


@contextlib.contextmanager
def fault_proxy(upstream: str, rule: Rule, edit: Edit | None = None) -> Iterator[str]:
    """``127.0.0.1:<port>`` forwarding to ``upstream`` except where ``rule`` answers instead;
    ``edit`` may add headers to or change the body of forwarded answers."""

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            answer = rule(self.command, self.path)
            if isinstance(answer, int):
                answer = Reply(answer, b'{"errors":[{"code":"UNKNOWN","message":"injected failure"}]}')
            if answer is not None:
                self.send_response(answer.status)
                headers = {"Content-Type": "application/json", **answer.headers}
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)
                return
            length = int(self.headers.get("Content-Length") or 0)
            data = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            req = urllib.request.Request(
                f"http://{upstream}{self.path}", data=data, headers=headers, method=self.command
            )
            try:
                resp = urllib.request.urlopen(req, timeout=10)
            except urllib.error.HTTPError as err:
                resp = err
            body = resp.read()
            extra: dict[str, str] = {}
            if edit is not None:
                extra, body = edit(self.command, self.path, body)
            self.send_response(resp.status)
            for k, v in resp.headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(k, v)
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


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
