"""The real HTTPS server on 127.0.0.1 with a CA from deploy/make-cert.sh (injected verifier)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.admission import documents
from tests.admission.conftest import running_server
from tests.admission.fakes import REPO, FakeVerifier, digest_of, make_admitter
from tests.admission.live import client_tls
from tests.conftest import REPO as SOURCE_TREE

TAG = f"{REPO}:h100"


@pytest.fixture
def port(verifier: FakeVerifier, certs: Path) -> Iterator[int]:
    with running_server(make_admitter(verifier), certs) as p:
        yield p


@pytest.fixture
def conn(port: int, certs: Path) -> Iterator[http.client.HTTPSConnection]:
    c = http.client.HTTPSConnection("127.0.0.1", port, context=client_tls(certs), timeout=30)
    yield c
    c.close()


def post(conn: http.client.HTTPSConnection, path: str, body: bytes, **headers: str) -> tuple[int, Any]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **headers})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_reviews_over_one_kept_alive_connection(conn: http.client.HTTPSConnection) -> None:
    for i in range(3):
        doc = documents.load("pod-create", TAG, uid=f"uid-{i}")
        status, answer = post(conn, "/mutate?timeout=10s", json.dumps(doc).encode())
        assert status == 200
        assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == f"uid-{i}"
        assert answer["response"]["allowed"] is True and answer["response"]["patchType"] == "JSONPatch"
    status, answer = post(
        conn, "/validate", json.dumps(documents.load("pod-create", f"{REPO}@{digest_of(TAG)}")).encode()
    )
    assert status == 200 and answer["response"]["allowed"] is True and "patch" not in answer["response"]


def test_a_body_that_is_not_json_is_http_400(conn: http.client.HTTPSConnection) -> None:
    for body in (b"{not json", b"\xff\xfe", b"[" * 100_000):
        status, answer = post(conn, "/validate", body)
        assert status == 400 and "not JSON" in answer["error"]


def test_json_that_is_not_a_review_is_answered_with_a_400_denial(conn: http.client.HTTPSConnection) -> None:
    status, answer = post(
        conn,
        "/mutate",
        b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u-9"}}',
    )
    assert status == 200
    assert answer["response"]["uid"] == "u-9" and answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 400
    status, answer = post(conn, "/mutate", b"null")
    assert status == 200 and answer["response"]["status"]["code"] == 400


def test_routes(conn: http.client.HTTPSConnection) -> None:
    conn.request("GET", "/healthz")
    r = conn.getresponse()
    assert (r.status, json.loads(r.read())) == (200, {"status": "ok", "clients": "client-ca"})
    conn.request("GET", "/mutate")
    r = conn.getresponse()
    assert r.status == 405 and "POST an AdmissionReview" in json.loads(r.read())["error"]
    status, answer = post(conn, "/admit", b"{}")
    assert status == 404 and "/mutate or /validate" in answer["error"]


def test_chunked_bodies(port: int, certs: Path) -> None:
    body = json.dumps(documents.load("pod-create", TAG)).encode()
    c = http.client.HTTPSConnection("127.0.0.1", port, context=client_tls(certs), timeout=30)
    c.request(
        "POST",
        "/mutate",
        body=iter([body[:100], body[100:]]),
        encode_chunked=True,
        headers={"Transfer-Encoding": "chunked"},
    )
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["response"]["allowed"] is True
    c.close()


def raw(port: int, certs: Path, data: bytes, *, hang_up: bool = False) -> bytes:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    with client_tls(certs).wrap_socket(sock, server_hostname="127.0.0.1") as tls:
        tls.sendall(data)
        if hang_up:
            return b""
        chunks = []
        while chunk := tls.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"POST /mutate HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n", b"413"),
        (b"POST /mutate HTTP/1.1\r\nContent-Length: ten\r\n\r\n", b"400"),
        (b"POST /mutate HTTP/2.0\r\n\r\n", b"505"),
        (b"POST /mutate HTTP/1.1\r\nno-colon\r\n\r\n", b"400"),
        (b"POST /mutate HTTP/1.1\r\nX: " + b"a" * 70_000 + b"\r\n\r\n", b"431"),
        # A head that never ends is cut off while it arrives.
        (b"POST /mutate HTTP/1.1\r\nX: " + b"a" * 100_000, b"431"),
        (b"POST /mutate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", b"400"),
    ],
)
def test_broken_http_is_answered_and_the_server_keeps_serving(
    port: int, certs: Path, conn: http.client.HTTPSConnection, data: bytes, status: bytes
) -> None:
    assert raw(port, certs, data).startswith(b"HTTP/1.1 " + status)
    status_code, answer = post(conn, "/mutate", json.dumps(documents.load("pod-create", TAG)).encode())
    assert status_code == 200 and answer["response"]["allowed"] is True


def test_a_client_that_hangs_up_mid_body_does_not_hurt(
    port: int, certs: Path, conn: http.client.HTTPSConnection
) -> None:
    raw(port, certs, b"POST /mutate HTTP/1.1\r\nContent-Length: 100\r\n\r\n{", hang_up=True)
    raw(port, certs, b"POST /mutate HTTP/1.1\r\n", hang_up=True)
    status, _ = post(conn, "/mutate", json.dumps(documents.load("pod-create", TAG)).encode())
    assert status == 200


def test_only_clients_trusting_the_ca_get_through(port: int) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        c = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(), timeout=30)
        c.request("GET", "/healthz")


def test_idle_and_stalled_connections_are_dropped(
    verifier: FakeVerifier, certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelbake.admission.http import server

    monkeypatch.setattr(server, "IDLE_SECONDS", 0.3)
    monkeypatch.setattr(server, "HEADER_SECONDS", 0.3)
    with running_server(make_admitter(verifier), certs) as p:
        for data in (
            b"",
            b"POST /mutate HTTP/1.1\r\nContent-Length: 100\r\n\r\n{",
            b"POST /mutate HTTP/1.1\r\nHost: x",
        ):
            sock = socket.create_connection(("127.0.0.1", p), timeout=10)
            with client_tls(certs).wrap_socket(sock, server_hostname="127.0.0.1") as tls:
                tls.sendall(data)
                # The server hangs up (EOF or reset) with nothing said; a server that kept the
                # connection would leave this read to time out (TimeoutError fails the test).
                try:
                    received = tls.recv(1024)
                except ConnectionResetError:
                    received = b""
                assert received == b"", received


def test_pipelined_requests_are_answered_in_order_even_when_the_first_waits(
    verifier: FakeVerifier, certs: Path
) -> None:
    verifier.gate = threading.Event()
    first = json.dumps(documents.load("pod-create", TAG, uid="first")).encode()
    second = json.dumps(documents.load("pod-create", "nginx:1.27", uid="second")).encode()

    def post_bytes(body: bytes) -> bytes:
        return b"POST /mutate HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body

    with running_server(make_admitter(verifier), certs) as p:
        sock = socket.create_connection(("127.0.0.1", p), timeout=30)
        with client_tls(certs).wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            tls.sendall(post_bytes(first) + post_bytes(second))
            verifier.gate.set()
            reader = tls.makefile("rb")
            uids = []
            for _ in range(2):
                assert reader.readline().startswith(b"HTTP/1.1 200")
                length = 0
                while (line := reader.readline()) != b"\r\n":
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                uids.append(json.loads(reader.read(length))["response"]["uid"])
    assert uids == ["first", "second"]


def test_a_rotated_certificate_is_served_without_a_restart(
    verifier: FakeVerifier, certs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelbake.admission.http import server

    monkeypatch.setattr(server, "CERT_CHECK_SECONDS", 0.05)
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for name in ("tls.crt", "tls.key", "ca.crt"):
        shutil.copy(certs / name, mounted / name)
    rotated = tmp_path / "rotated"
    subprocess.run(
        [str(SOURCE_TREE / "deploy" / "make-cert.sh"), "--out", str(rotated), "--ip", "127.0.0.1"],
        check=True,
        capture_output=True,
    )

    def handshake(ca: Path, port: int) -> bool:
        """A request answered, each side's certificate from ``ca``'s CA."""
        try:
            conn = http.client.HTTPSConnection("127.0.0.1", port, context=client_tls(ca), timeout=10)
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False

    with running_server(make_admitter(verifier), mounted) as p:
        assert handshake(certs, p) and not handshake(rotated, p)
        # As a Secret update does: new files in place, newer mtimes; make-cert.sh makes a new CA,
        # so the API server's new client certificate is the new CA's too.
        for name in ("tls.key", "tls.crt", "ca.crt"):
            shutil.copy(rotated / name, mounted / name)
            os.utime(mounted / name, (time.time() + 5, time.time() + 5))
        deadline = time.monotonic() + 20
        while not handshake(rotated, p) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert handshake(rotated, p) and not handshake(certs, p)


def test_a_large_review_is_planned_off_the_event_loop(
    verifier: FakeVerifier, certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a large review is decoded and planned, ``/healthz`` and small reviews still answer.

    The planning is made to block until the test lets it go: were it on the event loop (as it
    was when a pod spec of adversarial references stalled both workers for 21 s), nothing else
    could answer meanwhile.
    """
    admitter = make_admitter(verifier)
    planning = threading.Event()
    release = threading.Event()
    review_nowait = admitter.review_nowait

    def slow_for_large(doc: Any, endpoint: Any, *, started: float) -> Any:
        if len(documents.pod_spec(doc)["containers"]) > 1:
            planning.set()
            assert release.wait(30)
        return review_nowait(doc, endpoint, started=started)

    monkeypatch.setattr(admitter, "review_nowait", slow_for_large)
    doc = documents.load("pod-create", TAG)
    spec = documents.pod_spec(doc)
    # Within the cap of governed images (bounds.MAX_GOVERNED), padded past INLINE_BODY.
    spec["containers"] = [dict(spec["containers"][0], name=f"c{i}") for i in range(200)]
    doc["request"]["object"]["metadata"].setdefault("annotations", {})["pad"] = "x" * 70_000
    body = json.dumps(doc).encode()
    from kernelbake.admission.http.server import INLINE_BODY

    assert len(body) > INLINE_BODY
    with running_server(admitter, certs) as port:
        answers: list[Any] = []

        def send_large() -> None:
            c = http.client.HTTPSConnection("127.0.0.1", port, context=client_tls(certs), timeout=30)
            answers.append(post(c, "/mutate", body))
            c.close()

        sender = threading.Thread(target=send_large)
        sender.start()
        assert planning.wait(30)
        c = http.client.HTTPSConnection("127.0.0.1", port, context=client_tls(certs), timeout=5)
        c.request("GET", "/healthz")
        health = c.getresponse()
        assert (health.status, json.loads(health.read())) == (200, {"status": "ok", "clients": "client-ca"})
        small = json.dumps(documents.load("pod-create", TAG)).encode()
        assert post(c, "/mutate", small)[1]["response"]["allowed"] is True
        c.close()
        release.set()
        sender.join(30)
        status, answer = answers[0]
        assert status == 200 and answer["response"]["allowed"] is True
