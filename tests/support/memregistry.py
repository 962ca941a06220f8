"""An in-memory OCI registry on 127.0.0.1: the part of the distribution API that signing and
verification use, so their unit tests need no docker-registry binary.

It speaks real HTTP, so ``RegistryClient`` is exercised as it is against a registry: ping,
manifests (GET/HEAD/PUT, by tag or digest, exact bytes), blobs (GET/HEAD, monolithic
POST+PUT upload) and, when ``referrers_api`` is on, the OCI 1.1 referrers API with
``OCI-Subject``. By default it has no referrers API, like Debian's docker-registry 2.8, so
the fallback tag is what lists signatures. Integration tests keep using the real registry.

With ``page_size``, the referrers API pages its listing as the distribution spec says: each
page but the last has a ``Link: <url>; rel="next"`` header, relative unless ``link_base`` (a
scheme and host, which may name another host) is set. Referrers are listed in push order.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import re
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
_ROUTE = re.compile(r"^/v2/(?P<name>.+?)/(?P<kind>manifests|blobs/uploads|blobs|referrers)/(?P<rest>[^/]*)$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Store:
    """What the registry holds; tests may look inside."""

    def __init__(self, *, referrers_api: bool = False, page_size: int | None = None) -> None:
        self.referrers_api = referrers_api
        self.page_size = page_size
        self.link_base = ""
        self.pages_served = 0
        self.manifests: dict[tuple[str, str], tuple[bytes, str]] = {}
        self.tags: dict[tuple[str, str], str] = {}
        self.blobs: dict[tuple[str, str], bytes] = {}
        self.uploads: dict[str, str] = {}
        # Blob GETs served, by digest (HEADs not counted): how often a reader fetched the bytes.
        self.blob_gets: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    def manifest(self, name: str, reference: str) -> tuple[str, bytes, str] | None:
        digest = reference if _DIGEST.match(reference) else self.tags.get((name, reference))
        found = self.manifests.get((name, digest)) if digest else None
        return (digest, *found) if digest and found else None

    def referrers(self, name: str, subject: str, artifact_type: str | None) -> list[dict[str, Any]]:
        entries = []
        for (repo, digest), (data, media_type) in self.manifests.items():
            if repo != name:
                continue
            doc = json.loads(data)
            if not isinstance(doc, dict) or (doc.get("subject") or {}).get("digest") != subject:
                continue
            kind = doc.get("artifactType") or (doc.get("config") or {}).get("mediaType")
            if artifact_type and kind != artifact_type:
                continue
            entry = {"mediaType": media_type, "digest": digest, "size": len(data)}
            if kind:
                entry["artifactType"] = kind
            if doc.get("annotations"):
                entry["annotations"] = doc["annotations"]
            entries.append(entry)
        return entries


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: without this, Nagle and delayed ACKs stall each
    # request by ~40 ms.
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: pytest shows failures, not every request

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        body = json.dumps({"errors": [{"code": code, "message": code.lower()}]}).encode()
        self._send(status, body, {"Content-Type": "application/json"})

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _route(self) -> tuple[str, str, str, dict[str, list[str]]] | None:
        url = urlsplit(self.path)
        m = _ROUTE.match(url.path)
        if m is None:
            return None
        return m["name"], m["kind"], m["rest"], parse_qs(url.query)

    def do_GET(self) -> None:
        if urlsplit(self.path).path == "/v2/":
            return self._send(200, b"{}", {"Content-Type": "application/json"})
        route = self._route()
        if route is None:
            return self._error(404, "NAME_UNKNOWN")
        name, kind, rest, query = route
        store = self.server.store
        with store.lock:
            if kind == "manifests":
                found = store.manifest(name, rest)
                if found is None:
                    return self._error(404, "MANIFEST_UNKNOWN")
                digest, data, media_type = found
                return self._send(200, data, {"Content-Type": media_type, "Docker-Content-Digest": digest})
            if kind == "blobs":
                blob = store.blobs.get((name, rest))
                if blob is None:
                    return self._error(404, "BLOB_UNKNOWN")
                if self.command == "GET":
                    store.blob_gets[rest] += 1
                return self._send(
                    200, blob, {"Content-Type": "application/octet-stream", "Docker-Content-Digest": rest}
                )
            if kind == "referrers" and store.referrers_api:
                artifact_type = (query.get("artifactType") or [None])[0]
                entries = store.referrers(name, rest, artifact_type)
                headers = {"Content-Type": OCI_INDEX}
                if store.page_size:
                    page = int((query.get("page") or ["0"])[0])
                    size = store.page_size
                    if (page + 1) * size < len(entries):
                        url = f"{store.link_base}/v2/{name}/referrers/{rest}?page={page + 1}"
                        headers["Link"] = f'<{url}>; rel="next"'
                    entries = entries[page * size : (page + 1) * size]
                store.pages_served += 1
                index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}
                return self._send(200, json.dumps(index).encode(), headers)
        return self._error(404, "NOT_FOUND")

    do_HEAD = do_GET

    def do_POST(self) -> None:
        route = self._route()
        self._body()
        if route is None or route[1] != "blobs/uploads" or route[2]:
            return self._error(404, "NOT_FOUND")
        upload = uuid.uuid4().hex
        with self.server.store.lock:
            self.server.store.uploads[upload] = route[0]
        self._send(
            202, headers={"Location": f"/v2/{route[0]}/blobs/uploads/{upload}", "Docker-Upload-UUID": upload}
        )

    def do_PUT(self) -> None:
        route = self._route()
        data = self._body()
        if route is None:
            return self._error(404, "NOT_FOUND")
        name, kind, rest, query = route
        store = self.server.store
        with store.lock:
            if kind == "blobs/uploads":
                if store.uploads.pop(rest, None) != name:
                    return self._error(404, "BLOB_UPLOAD_UNKNOWN")
                digest = (query.get("digest") or [""])[0]
                if digest != _digest(data):
                    return self._error(400, "DIGEST_INVALID")
                store.blobs[(name, digest)] = data
                return self._send(
                    201, headers={"Location": f"/v2/{name}/blobs/{digest}", "Docker-Content-Digest": digest}
                )
            if kind != "manifests":
                return self._error(405, "UNSUPPORTED")
            digest = _digest(data)
            if _DIGEST.match(rest) and rest != digest:
                return self._error(400, "DIGEST_INVALID")
            media_type = self.headers.get("Content-Type", "")
            store.manifests[(name, digest)] = (data, media_type)
            if not _DIGEST.match(rest):
                store.tags[(name, rest)] = digest
            headers = {"Location": f"/v2/{name}/manifests/{digest}", "Docker-Content-Digest": digest}
            if store.referrers_api and isinstance(doc := json.loads(data), dict) and doc.get("subject"):
                headers["OCI-Subject"] = doc["subject"]["digest"]
        self._send(201, headers=headers)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, store: Store) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.store = store

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client may hang up early (a size limit, a closed stream); anything else is a bug here.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def memory_registry(
    *, referrers_api: bool = False, page_size: int | None = None
) -> Iterator[tuple[str, Store]]:
    """Yields ``(127.0.0.1:<port>, store)`` while the registry serves."""
    server = _Server(Store(referrers_api=referrers_api, page_size=page_size))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="memregistry", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", server.store
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
