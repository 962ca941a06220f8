"""Registries that fail: a proxy in front of the real one that answers chosen requests with an
error status, and a port that accepts connections and never answers."""

from __future__ import annotations

import contextlib
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Rule = Callable[[str, str], int | None]  # (method, path) -> status to answer instead, or None


@contextlib.contextmanager
def fault_proxy(upstream: str, rule: Rule) -> Iterator[str]:
    """``127.0.0.1:<port>`` forwarding to ``upstream`` except where ``rule`` says fail."""

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            status = rule(self.command, self.path)
            if status is not None:
                body = b'{"errors":[{"code":"UNKNOWN","message":"injected failure"}]}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
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
            self.send_response(resp.status)
            for k, v in resp.headers.items():
                if k.lower() not in ("content-length", "transfer-encoding", "connection"):
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
