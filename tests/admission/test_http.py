from __future__ import annotations

import pytest

from kernelbake.admission.http import HEADER_LIMIT, BadRequest, parse_request, response

POST = b"POST /mutate?timeout=10s HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def test_requests_parse_one_at_a_time_and_wait_for_the_rest() -> None:
    buf = POST + POST[:30]
    parsed = parse_request(buf)
    assert parsed is not None
    request, used = parsed
    assert (request.method, request.path, request.body, request.keep_alive) == (
        "POST",
        "/mutate",
        b"{}",
        True,
    )
    assert used == len(POST)
    assert parse_request(buf[used:]) is None
    assert parse_request(POST[:-1]) is None


def test_chunked_bodies_with_and_without_trailers() -> None:
    head = b"POST /validate HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    for tail in (b"0\r\n\r\n", b"0\r\nX-Trailer: 1\r\n\r\n"):
        data = head + b"3;ext=1\r\nabc\r\n2\r\nde\r\n" + tail
        parsed = parse_request(data)
        assert parsed is not None
        assert parsed[0].body == b"abcde" and parsed[1] == len(data) and not parsed[0].keep_alive
        for cut in range(len(head), len(data)):
            assert parse_request(data[:cut]) is None


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"POST / HTTP/2.0\r\n\r\n", 505),
        (b"POST / HTTP/1.1\r\nno colon\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n", 413),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", 400),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 2000, 400),
        (b"POST / HTTP/1.1\r\nX: " + b"a" * HEADER_LIMIT, 431),
    ],
)
def test_broken_requests_name_their_status(data: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as err:
        parse_request(data)
    assert err.value.status == status


def test_responses() -> None:
    assert response(200, {"a": 1}, close=False) == (
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{"a":1}'
    )
    assert b"Connection: close\r\n" in response(400, {}, close=True)
