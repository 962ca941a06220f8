"""A small read-only client for OCI registries (distribution API v2), standard library only.

``inspect`` reads an image's config (labels) and only its last layer, which holds the cache
manifest, without pulling the image. Anonymous bearer tokens are fetched as registries ask;
plain HTTP is used for loopback registries only, as Docker does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import re
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from kernelbake.errors import BadInput, EnvironmentProblem, RegistryError
from kernelbake.runtime.bundle import MANIFEST, Manifest
from kernelbake.runtime.config import CACHE_ROOT

_MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_INDEX_TYPES = _MANIFEST_TYPES[0], _MANIFEST_TYPES[2]
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_LOOPBACK = re.compile(r"^(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d+)?$")
_MANIFEST_MEMBER = f"{CACHE_ROOT.lstrip('/')}/{MANIFEST}"


@dataclasses.dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        tail = f"@{self.digest}" if self.digest else f":{self.tag or 'latest'}"
        return f"{self.registry}/{self.repository}{tail}"


def parse_reference(text: str) -> Reference:
    """``host[:port]/repo[:tag][@sha256:…]``; Docker Hub short names are expanded."""
    name, _, digest = text.strip().partition("@")
    if digest and not _DIGEST.match(digest):
        raise BadInput(f"image reference {text!r}: digest must be sha256:<64 hex>")
    tag = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, _, tag = name.rpartition(":")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
    else:
        registry, repository = "docker.io", name if "/" in name else f"library/{name}"
    if not repository or not re.fullmatch(r"[a-z0-9]+([._/-][a-z0-9]+)*", repository):
        raise BadInput(f"image reference {text!r}: bad repository name {repository!r}")
    return Reference(registry, repository, tag or None, digest or None)


def base_url(registry: str) -> str:
    host = "registry-1.docker.io" if registry == "docker.io" else registry
    scheme = "http" if _LOOPBACK.match(registry) else "https"
    return f"{scheme}://{host}"


def _bearer_challenge(header: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', header))


class RegistryClient:
    def __init__(self, registry: str, *, timeout: float = 30.0) -> None:
        self.registry = registry
        self.base = base_url(registry)
        self.timeout = timeout
        self._token: str | None = None

    def _open(self, url: str, headers: Mapping[str, str]) -> tuple[bytes, Mapping[str, str]]:
        request = urllib.request.Request(url, headers=dict(headers))
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        with urllib.request.urlopen(request, timeout=self.timeout) as resp:
            return resp.read(), dict(resp.headers.items())

    def _authenticate(self, challenge: str) -> None:
        params = _bearer_challenge(challenge)
        realm = params.pop("realm", "")
        if not challenge.lower().startswith("bearer") or not realm:
            raise RegistryError(f"{self.registry}: needs credentials kernelbake does not have ({challenge})")
        url = f"{realm}?{urllib.parse.urlencode(params)}"
        body, _ = self._open(url, {})
        doc = json.loads(body)
        self._token = doc.get("token") or doc.get("access_token")

    def get(self, path: str, accept: tuple[str, ...] = ()) -> tuple[bytes, Mapping[str, str]]:
        url = f"{self.base}{path}"
        headers = {"Accept": ", ".join(accept)} if accept else {}
        try:
            try:
                return self._open(url, headers)
            except urllib.error.HTTPError as exc:
                if exc.code != 401 or self._token:
                    raise
                self._authenticate(exc.headers.get("WWW-Authenticate", ""))
                return self._open(url, headers)
        except urllib.error.HTTPError as exc:
            raise RegistryError(f"{self.registry}: GET {path}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise EnvironmentProblem(
                f"registry {self.registry} is unreachable ({self.base}): {reason}",
                hint="start it (make registry) or check the address",
            ) from None

    def ping(self) -> None:
        """Any HTTP answer from /v2/ means a registry is there (401 included)."""
        with contextlib.suppress(RegistryError):
            self.get("/v2/")

    def manifest(self, ref: Reference) -> tuple[dict[str, Any], str]:
        body, headers = self.get(f"/v2/{ref.repository}/manifests/{ref.reference}", _MANIFEST_TYPES)
        digest = headers.get("Docker-Content-Digest") or "sha256:" + hashlib.sha256(body).hexdigest()
        doc: dict[str, Any] = json.loads(body)
        if doc.get("mediaType") in _INDEX_TYPES or "manifests" in doc:
            chosen = next(
                (
                    m
                    for m in doc.get("manifests", [])
                    if m.get("platform", {}).get("os") == "linux"
                    and m.get("platform", {}).get("architecture") == "amd64"
                ),
                None,
            )
            if chosen is None:
                raise RegistryError(f"{ref}: the index has no linux/amd64 image")
            return self.manifest(dataclasses.replace(ref, digest=chosen["digest"]))
        return doc, digest

    def blob(self, ref: Reference, digest: str) -> bytes:
        body, _ = self.get(f"/v2/{ref.repository}/blobs/{digest}")
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise RegistryError(f"{ref}: blob {digest} does not match its digest")
        return body


@dataclasses.dataclass(frozen=True)
class RemoteImage:
    ref: Reference
    digest: str
    labels: dict[str, str]
    layers: tuple[str, ...]
    cache_manifest: Manifest | None
    cache_manifest_digest: str | None


def _manifest_from_layer(blob: bytes) -> bytes | None:
    data = gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if member.name.lstrip("./") == _MANIFEST_MEMBER and member.isfile():
                fh = tar.extractfile(member)
                return fh.read() if fh else None
    return None


def inspect_remote(text: str, *, client: RegistryClient | None = None) -> RemoteImage:
    ref = parse_reference(text)
    client = client or RegistryClient(ref.registry)
    doc, digest = client.manifest(ref)
    config = json.loads(client.blob(ref, doc["config"]["digest"]))
    labels = dict((config.get("config") or {}).get("Labels") or {})
    layers = tuple(str(layer["digest"]) for layer in doc.get("layers", []))
    raw = _manifest_from_layer(client.blob(ref, layers[-1])) if layers else None
    manifest = Manifest.from_json(raw.decode(), source=f"{ref} {_MANIFEST_MEMBER}") if raw else None
    manifest_digest = "sha256:" + hashlib.sha256(raw).hexdigest() if raw else None
    return RemoteImage(ref, digest, labels, layers, manifest, manifest_digest)
