"""The total-deadline machinery on its own (no registry): which bound applies, and that the
watchdog ends a blocked read at the deadline and leaves sockets of finished calls alone."""

from __future__ import annotations

import hashlib
import http.server
import socket
import threading
import time
from pathlib import Path

import pytest

from kernelbake.oci import DeadlineExceeded, RegistryClient, RegistryUnreachable, parse_reference
from kernelbake.oci.deadline import Bound, current_operation, operation
from kernelbake.settings import Settings


def test_an_operation_takes_the_earliest_bound() -> None:
    outer = Bound(time.monotonic() + 1.0, 1.0, "verification deadline")
    with operation(10.0, host="r.example", what="manifest r.example/a:v1", outer=outer) as op:
        assert op.bound is outer
        # A call made inside another (referrers → fallback tag manifest) cannot outlive it.
        with operation(30.0, host="r.example", what="manifest r.example/a:sha256-x") as inner:
            assert inner.bound is outer
            assert current_operation() is inner
        assert current_operation() is op
    assert current_operation() is None
    with operation(0.5, host="r.example", what="blob", outer=outer) as op:
        assert op.bound.seconds == 0.5 and op.bound.label == ""


def test_the_message_names_registry_call_and_bound() -> None:
    outer = Bound(time.monotonic() - 1, 8.0, "verification deadline")
    op = operation(10.0, host="127.0.0.1:5055", what="manifest 127.0.0.1:5055/kb/x:v1", outer=outer)
    op.request = ("GET", "auth.example")
    with pytest.raises(DeadlineExceeded) as caught, op:
        op.check()
    assert str(caught.value) == (
        "127.0.0.1:5055: GET manifest 127.0.0.1:5055/kb/x:v1 did not finish within 8s "
        "(verification deadline) (waiting for auth.example)"
    )
    assert isinstance(caught.value, RegistryUnreachable)  # what callers already handle


def test_a_failure_after_the_deadline_is_reported_as_the_deadline() -> None:
    op = operation(0.01, host="r.example", what="blob r.example/a@sha256:1")
    with pytest.raises(DeadlineExceeded, match=r"did not finish within 0\.01s"), op:
        time.sleep(0.05)
        raise RegistryUnreachable("transfer broke off")


def test_the_watchdog_ends_a_blocked_read_at_the_deadline() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        started = time.monotonic()
        op = operation(0.3, host="r.example", what="manifest")
        with pytest.raises(DeadlineExceeded), op:
            op.watch(ours)
            # The peer never writes: only the watchdog can end this read (an EOF, which a
            # caller could take for a short answer: the operation reports the deadline).
            assert ours.recv(1) == b""
        elapsed = time.monotonic() - started
        assert op.fired
    assert 0.3 <= elapsed < 1.3


def test_sockets_of_finished_calls_are_left_alone() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        with operation(0.1, host="r.example", what="manifest") as op:
            op.watch(ours)
        time.sleep(0.3)  # past the deadline: a connection kept alive for the next call
        assert not op.fired and not op.sockets
        theirs.sendall(b"x")
        assert ours.recv(1) == b"x"


def test_client_deadline_nests_to_the_earliest_and_is_per_thread() -> None:
    client = RegistryClient(Settings(docker_config=Path("/nonexistent")), timeout=10)
    seen: list[float] = []
    with client.deadline(1.0, "outer"), client.deadline(5.0, "inner"):
        with client._op("r.example", "x") as op:
            assert op.bound.label == "outer"

        def other_thread() -> None:
            with client._op("r.example", "x") as op:
                seen.append(op.bound.seconds)

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
    assert seen == [10]


class _SlowCommit(http.server.BaseHTTPRequestHandler):
    """A registry that lacks every blob and takes ``delay`` seconds to commit an upload."""

    delay = 0.0

    def do_HEAD(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        self.send_response(202)
        self.send_header("Location", "/v2/kb/x/blobs/uploads/1")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_PUT(self) -> None:
        left = int(self.headers["Content-Length"])
        while left:
            left -= len(self.rfile.read(min(left, 1 << 20)))
        time.sleep(self.delay)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(("size", "delay", "ok"), [(16 << 20, 1.2, True), (1 << 20, 1.2, False)])
def test_a_blob_upload_is_bounded_by_its_size(tmp_path: Path, size: int, delay: float, ok: bool) -> None:
    """A flat 0.5 s would end a 16 MiB upload whose commit takes 1.2 s; 0.5 s + 1 s per 8 MiB
    (2.5 s) lets it finish, and a 1 MiB one still ends at its own bound (0.625 s)."""
    handler = type("H", (_SlowCommit,), {"delay": delay})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    blob = tmp_path / "pages.img"
    blob.write_bytes(b"\0" * size)
    digest = "sha256:" + hashlib.sha256(blob.read_bytes()).hexdigest()
    client = RegistryClient(Settings(docker_config=tmp_path / "docker"), timeout=0.5)
    ref = parse_reference(f"127.0.0.1:{server.server_address[1]}/kb/x:v1")
    try:
        if ok:
            with blob.open("rb") as fh:
                assert client.put_blob_stream(ref, digest, size, lambda: fh) == digest
        else:
            with (
                blob.open("rb") as fh,
                pytest.raises(DeadlineExceeded, match=r"upload blob .* did not finish within 0\.625s"),
            ):
                client.put_blob_stream(ref, digest, size, lambda: fh)
    finally:
        server.shutdown()
        server.server_close()
