"""Just enough HTTP/1.1 for the API server's webhook client, as pure functions over a buffer.

``parse_request(buffer)`` returns the first complete request and how many bytes it used, None
while it is still arriving, or raises ``BadRequest`` with the status to answer. Bodies come
with Content-Length or chunked; requests are kept alive unless they say ``Connection: close``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

# An AdmissionReview carries object and oldObject; etcd caps an object at 1.5 MiB.
MAX_BODY = 8 * 1024 * 1024
HEADER_LIMIT = 64 * 1024
_MAX_CHUNK_LINE = 1024
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    505: "HTTP Version Not Supported",
}


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


def parse_request(buf: bytes | bytearray) -> tuple[Request, int] | None:
    end = buf.find(b"\r\n\r\n", 0, HEADER_LIMIT + 4)
    if end < 0:
        if len(buf) > HEADER_LIMIT:
            raise BadRequest(431, "request headers too large")
        return None
    method, target, headers = _parse_head(bytes(buf[:end]))
    start = end + 4
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunked = _chunked(buf, start)
        if chunked is None:
            return None
        body, used = chunked
    else:
        length = headers.get("content-length", "0")
        if not length.isdigit():
            raise BadRequest(400, "Content-Length is not a number")
        size = int(length)
        if size > MAX_BODY:
            raise BadRequest(413, f"body larger than {MAX_BODY} bytes")
        if len(buf) < start + size:
            return None
        body, used = bytes(buf[start : start + size]), start + size
    return Request(method, target, headers, body), used


def response(status: int, payload: Any, *, close: bool) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    extra = "Connection: close\r\n" if close else ""
    head = (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise BadRequest(400, "malformed request line") from None
    if not version.startswith("HTTP/1."):
        raise BadRequest(505, f"{version} is not supported")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise BadRequest(400, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    return method, target, headers


def _chunked(buf: bytes | bytearray, pos: int) -> tuple[bytes, int] | None:
    """(body, end) of a chunked body starting at ``pos``, or None while incomplete."""
    chunks: list[bytes] = []
    total = 0
    while True:
        eol = buf.find(b"\r\n", pos, pos + _MAX_CHUNK_LINE)
        if eol < 0:
            if len(buf) - pos > _MAX_CHUNK_LINE:
                raise BadRequest(400, "malformed chunk size")
            return None
        try:
            size = int(bytes(buf[pos:eol]).split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadRequest(400, "malformed chunk size") from None
        pos = eol + 2
        if size == 0:
            # Optional trailers, then an empty line.
            if buf[pos : pos + 2] == b"\r\n":
                return b"".join(chunks), pos + 2
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                if len(buf) - pos > HEADER_LIMIT:
                    raise BadRequest(431, "trailers too large")
                return None
            return b"".join(chunks), end + 4
        total += size
        if total > MAX_BODY:
            raise BadRequest(413, f"body larger than {MAX_BODY} bytes")
        if len(buf) < pos + size + 2:
            return None
        if buf[pos + size : pos + size + 2] != b"\r\n":
            raise BadRequest(400, "chunk not followed by CRLF")
        chunks.append(bytes(buf[pos : pos + size]))
        pos += size + 2
