"""A small OCI distribution client on ``requests``.

Manifests travel as the exact bytes the registry holds (never re-serialized), every blob and
manifest fetched by digest is checked against that digest, and referrers are found through the
OCI 1.1 referrers API or, on registries without it (Debian's docker-registry), through the
fallback tag ``sha256-<hex>`` that points at an index of referrers.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, TypeAlias
from urllib.parse import urljoin, urlsplit

import requests

from kernelbake.cache import BoundedCache
from kernelbake.contract import jsondoc
from kernelbake.oci.auth import Challenge, Credentials, docker_credentials, parse_challenge
from kernelbake.oci.deadline import Bound, DeadlineAdapter, Operation, current_operation, operation
from kernelbake.oci.errors import (
    RegistryDenied,
    RegistryNotFound,
    RegistryProtocolError,
    RegistryServerError,
    RegistryUnreachable,
)
from kernelbake.oci.listing import MAX_BYTES, MAX_PAGES, Listing, bound_text, descriptors, index_entries
from kernelbake.oci.reference import Reference, check_digest
from kernelbake.oci.types import (
    MANIFEST_TYPES,
    OCI_INDEX,
    Descriptor,
    Manifest,
    encode_json,
    sha256_digest,
)
from kernelbake.runner import Runner, run
from kernelbake.settings import Settings

MAX_MANIFEST_BYTES = 4 << 20
DEFAULT_MAX_BLOB_BYTES = 64 << 20
# Content fetched by digest is immutable: keep recent small items (admission verifies the same
# images over and over). Only what a digest names is cached, never tags or referrer listings.
CACHE_BYTES = 32 << 20
CACHE_ITEM_BYTES = 4 << 20
# The byte bound is the one that matters; this one only caps bookkeeping for tiny items.
CACHE_ENTRIES = 65_536

# (host, repository, digest) -> (content already checked against the digest, media type).
_DigestCache: TypeAlias = BoundedCache[tuple[str, str, str], tuple[bytes, str]]


def _digest_cache() -> _DigestCache:
    return BoundedCache(CACHE_ENTRIES, max_weight=CACHE_BYTES, weigh=lambda item: len(item[0]))


def fallback_tag(digest: str) -> str:
    """The OCI 1.1 referrers tag schema: ``sha256:<hex>`` → ``sha256-<hex>``."""
    return check_digest(digest).replace(":", "-")


def _is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _content_type(resp: requests.Response) -> str:
    return resp.headers.get("Content-Type", "").split(";")[0].strip()


def _shown_url(url: str) -> str:
    """A URL a registry chose, cut short for one-line messages."""
    return url if len(url) <= 80 else url[:77] + "..."


# A blob upload's bound grows with its size: the call's timeout, plus a second for every
# UPLOAD_FLOOR bytes (a floor of 8 MiB/s). A snapshot's 2.2 GB of pages did not reach a registry
# on 127.0.0.1 within a flat 10 s; a stalled upload still ends, by its size, and says so.
UPLOAD_FLOOR = 8 << 20


def upload_seconds(timeout: float, size: int) -> float:
    """How long uploading ``size`` bytes may take, all of it: ``timeout`` + 1 s per 8 MiB."""
    return timeout + size / UPLOAD_FLOOR


def base_url(host: str, insecure_hosts: Collection[str] = ()) -> str:
    """``http://`` for loopback hosts and those named insecure (docker's rule), else ``https://``.

    Loopback is decided on the address, not the name's prefix: ``127.0.0.1.evil.example`` is
    someone else's host and gets HTTPS.
    """
    scheme = "http" if host in insecure_hosts or _is_loopback(host) else "https"
    return f"{scheme}://{host}"


def _reason(exc: BaseException) -> str:
    """The OS-level cause inside requests' and urllib3's wrappers, in words."""
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        e = todo.pop(0)
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError):
            return "connection refused"
        if isinstance(e, ConnectionResetError):
            return "connection reset"
        if isinstance(e, socket.gaierror):
            return "unknown host"
        if isinstance(e, ssl.SSLError):
            return f"TLS error: {e.reason or e}"
        todo += [getattr(e, "reason", None), e.__cause__, e.__context__, *e.args]
    return type(exc).__name__


@dataclasses.dataclass(frozen=True)
class PushResult:
    digest: str
    # The registry indexed the subject itself (OCI-Subject header): no fallback tag needed.
    subject_indexed: bool = False


class RegistryClient:
    """Talks to registries over HTTPS, or HTTP for loopback and ``insecure_hosts`` (as docker does).

    ``timeout`` bounds each call as a whole (connect, token exchange, redirects, the last byte
    of the body), not each socket read; ``deadline()`` bounds a sequence of calls.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        timeout: float = 10.0,
        insecure_hosts: Iterable[str] | None = None,
        session: requests.Session | None = None,
        runner: Runner = run,
    ) -> None:
        self.settings = settings or Settings.from_env()
        self.timeout = timeout
        hosts = self.settings.insecure_registries if insecure_hosts is None else insecure_hosts
        self._insecure = frozenset(hosts)
        self._session = session or requests.Session()
        adapter = DeadlineAdapter()
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._runner = runner
        self._credentials: dict[str, Credentials | None] = {}
        # Authorization header per (host, repository), learnt from the last challenge.
        self._auth: dict[tuple[str, str], str] = {}
        self._referrers_api: dict[str, bool] = {}
        self._cache = _digest_cache()
        self._bounds = threading.local()

    @contextlib.contextmanager
    def deadline(self, seconds: float, label: str = "deadline") -> Iterator[None]:
        """Every call this thread makes inside ends by ``seconds`` from now (or its own
        ``timeout``, if sooner); one that cannot raises ``DeadlineExceeded`` naming ``label``."""
        outer: Bound | None = getattr(self._bounds, "bound", None)
        bound = Bound(time.monotonic() + seconds, seconds, label)
        self._bounds.bound = bound if outer is None or bound.at < outer.at else outer
        try:
            yield
        finally:
            self._bounds.bound = outer

    def _op(self, host: str, what: str, seconds: float | None = None) -> Operation:
        return operation(
            self.timeout if seconds is None else seconds,
            host=host,
            what=what,
            outer=getattr(self._bounds, "bound", None),
        )

    # -- plumbing -----------------------------------------------------------------------

    def _base(self, host: str) -> str:
        return base_url(host, self._insecure)

    def _creds(self, host: str) -> Credentials | None:
        if host not in self._credentials:
            # A credential helper is part of the call: it gets what is left of the deadline.
            op = current_operation()
            timeout = op.check() if op is not None else self.timeout
            self._credentials[host] = docker_credentials(
                host, self.settings.docker_config, self._runner, timeout=timeout
            )
        return self._credentials[host]

    def _send(self, method: str, url: str, *, what: str, **kw: Any) -> requests.Response:
        op = current_operation()
        if op is None:
            with self._op(urlsplit(url).netloc, what):
                return self._send(method, url, what=what, **kw)
        op.request = (method, urlsplit(url).netloc)
        # What is left of the call's deadline, for the connect and for each read; the
        # watchdog ends a transfer that keeps reads alive past it.
        left = op.check()
        try:
            return self._session.request(method, url, timeout=(left, left), allow_redirects=True, **kw)
        except requests.RequestException as exc:
            if op.expired():
                raise op.exceeded() from None
            if isinstance(exc, requests.Timeout):
                raise RegistryUnreachable(f"{what}: no answer within {left:.3g}s from {url}") from None
            if isinstance(exc, requests.ConnectionError):
                reason = _reason(exc)
                if reason in ("connection refused", "unknown host") or reason.startswith("TLS"):
                    raise RegistryUnreachable(f"{what}: cannot connect to {url} ({reason})") from None
                raise RegistryUnreachable(f"{what}: connection to {url} broke ({reason})") from None
            raise RegistryUnreachable(f"{what}: request to {url} failed ({type(exc).__name__})") from None

    def _authorize(self, challenge: Challenge, host: str, *, what: str) -> str | None:
        creds = self._creds(host)
        if challenge.scheme == "basic":
            if not creds or not creds.username:
                return None
            return "Basic " + base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
        if challenge.scheme != "bearer" or "realm" not in challenge.params:
            return None
        params = {k: v for k, v in challenge.params.items() if k in ("service", "scope")}
        if creds and creds.identity_token:
            resp = self._send(
                "POST",
                challenge.params["realm"],
                what=what,
                data={**params, "grant_type": "refresh_token", "refresh_token": creds.identity_token},
            )
        else:
            auth = (creds.username, creds.password) if creds and creds.username else None
            resp = self._send("GET", challenge.params["realm"], what=what, params=params, auth=auth)
        if resp.status_code in (401, 403):
            raise RegistryDenied(f"{what}: token service {challenge.params['realm']} refused the credentials")
        if resp.status_code != 200:
            raise RegistryServerError(
                f"{what}: token service {challenge.params['realm']} answered {resp.status_code}"
            )
        try:
            doc = resp.json()
            token = doc.get("token") or doc.get("access_token")
        except ValueError:
            token = None
        if not isinstance(token, str) or not token:
            raise RegistryProtocolError(f"{what}: token service gave no token")
        return f"Bearer {token}"

    def _request(
        self,
        method: str,
        ref: Reference,
        path: str,
        *,
        what: str,
        ok: tuple[int, ...] = (200,),
        headers: Mapping[str, str] | None = None,
        **kw: Any,
    ) -> requests.Response:
        """One API call under ``/v2/<repo>/``; authenticates on a challenge and retries once."""
        host, key = ref.api_host, (ref.api_host, ref.repository)
        url = path if path.startswith("http") else f"{self._base(host)}/v2/{ref.repository}/{path}"
        # Credentials for this registry go to this registry only (an upload Location may not).
        ours = urlsplit(url).netloc == host
        hdrs = dict(headers or {})
        if ours and key in self._auth:
            hdrs["Authorization"] = self._auth[key]
        resp = self._send(method, url, what=what, headers=hdrs, **kw)
        if resp.status_code == 401 and ours:
            challenge = parse_challenge(resp.headers.get("WWW-Authenticate", ""))
            header = challenge and self._authorize(challenge, host, what=what)
            if header:
                resp.close()
                self._auth[key] = header
                hdrs["Authorization"] = header
                resp = self._send(method, url, what=what, headers=hdrs, **kw)
        if resp.status_code in ok:
            return resp
        status = resp.status_code
        resp.close()
        if status in (401, 403):
            hint = (
                "run docker login" if self._creds(host) is None else "check the credentials in docker config"
            )
            raise RegistryDenied(f"{what}: {host} refused access ({status}); {hint}")
        if status == 404:
            raise RegistryNotFound(f"{what}: not found ({method} {url} → 404)")
        if status >= 500:
            raise RegistryServerError(f"{what}: {host} failed ({method} {url} → {status})")
        raise RegistryProtocolError(f"{what}: unexpected {status} from {method} {url}")

    @staticmethod
    def _read(resp: requests.Response, limit: int, *, what: str) -> bytes:
        declared = resp.headers.get("Content-Length")
        if declared and declared.isdigit() and int(declared) > limit:
            resp.close()
            raise RegistryProtocolError(f"{what}: {declared} bytes is over the {limit}-byte limit")
        chunks, total = [], 0
        try:
            for chunk in resp.iter_content(1 << 16):
                total += len(chunk)
                if total > limit:
                    raise RegistryProtocolError(f"{what}: more than the {limit}-byte limit")
                chunks.append(chunk)
        except requests.RequestException:
            # Bytes already read may sit in urllib3's buffer: say what was promised, not a count.
            promised = f" before the last of its {declared} bytes" if declared else ""
            raise RegistryUnreachable(f"{what}: transfer broke off{promised}") from None
        finally:
            resp.close()
        return b"".join(chunks)

    @staticmethod
    def _read_prefix(resp: requests.Response, limit: int, *, what: str) -> tuple[bytes, bool]:
        """Up to ``limit`` bytes of the body, and whether there was more (then not read)."""
        chunks, total, cut = [], 0, False
        try:
            for chunk in resp.iter_content(1 << 16):
                if total + len(chunk) > limit:
                    chunks.append(chunk[: limit - total])
                    cut = True
                    break
                total += len(chunk)
                chunks.append(chunk)
        except requests.RequestException:
            raise RegistryUnreachable(f"{what}: transfer broke off") from None
        finally:
            resp.close()
        return b"".join(chunks), cut

    def ping(self, ref: Reference) -> None:
        """Raise ``RegistryUnreachable`` unless a registry answers at ``ref``'s host.

        Any HTTP answer from ``/v2/`` counts, 401 included: the question is whether something
        is there before a long build, not whether we may push yet.
        """
        with self._op(ref.api_host, "ping"):
            self._send("GET", f"{self._base(ref.api_host)}/v2/", what="ping").close()

    # -- manifests ----------------------------------------------------------------------

    def get_manifest(
        self,
        ref: Reference,
        *,
        accept: Iterable[str] = MANIFEST_TYPES,
        max_bytes: int = MAX_MANIFEST_BYTES,
    ) -> Manifest:
        """The manifest ``ref`` names, by digest when it has one (checked), else by tag.

        A tag is resolved by this one GET: the digest is computed from the bytes received, so
        what is returned is exactly what the digest names. ``max_bytes`` lowers the size limit
        (signature manifests are small; junk listed next to them is not read whole).
        """
        target = ref.digest or ref.tag
        if target is None:
            raise RegistryProtocolError(f"{ref}: neither tag nor digest")
        what = f"manifest {ref.name}{'@' if ref.digest else ':'}{target}"
        accepted = tuple(accept)
        cache_key = (ref.api_host, ref.repository, ref.digest or "")
        if ref.digest and (hit := self._cache.get(cache_key)) and hit[1] in accepted:
            if len(hit[0]) > max_bytes:
                raise RegistryProtocolError(f"{what}: {len(hit[0])} bytes is over the {max_bytes}-byte limit")
            return Manifest(hit[1], hit[0], ref.digest, what)
        with self._op(ref.api_host, what):
            resp = self._request(
                "GET",
                ref,
                f"manifests/{target}",
                what=what,
                headers={"Accept": ", ".join(accepted)},
                stream=True,
            )
            media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
            data = self._read(resp, max_bytes, what=what)
            if media_type not in MANIFEST_TYPES:
                try:
                    declared = jsondoc.loads(data).get("mediaType")
                except (ValueError, AttributeError):
                    declared = None
                if declared not in MANIFEST_TYPES:
                    raise RegistryProtocolError(f"{what}: not a manifest (Content-Type {media_type!r})")
                media_type = declared
            manifest = Manifest.from_bytes(data, media_type, source=what)
            if ref.digest and manifest.digest != ref.digest:
                raise RegistryProtocolError(f"{what}: registry sent content with digest {manifest.digest}")
        self._remember((ref.api_host, ref.repository, manifest.digest), data, media_type)
        return manifest

    def _remember(self, key: tuple[str, str, str], data: bytes, media_type: str = "") -> None:
        if len(data) <= CACHE_ITEM_BYTES:
            self._cache.put(key, (data, media_type))

    def resolve(self, ref: Reference) -> str:
        """Digest of the manifest ``ref`` names (one GET)."""
        return self.get_manifest(ref).digest

    def put_manifest(self, ref: Reference, data: bytes, media_type: str) -> PushResult:
        """Push ``data`` under ``ref``'s tag, or by its own digest when ``ref`` has no tag."""
        digest = sha256_digest(data)
        target = ref.tag if ref.tag and not ref.digest else digest
        what = f"push manifest {ref.name}:{target}"
        with self._op(ref.api_host, what):
            resp = self._request(
                "PUT",
                ref,
                f"manifests/{target}",
                what=what,
                ok=(200, 201, 202),
                headers={"Content-Type": media_type},
                data=data,
            )
            got = resp.headers.get("Docker-Content-Digest")
            resp.close()
        if got and got != digest:
            raise RegistryProtocolError(f"{what}: registry stored digest {got}, expected {digest}")
        return PushResult(digest, subject_indexed=bool(resp.headers.get("OCI-Subject")))

    # -- blobs --------------------------------------------------------------------------

    def get_blob(self, ref: Reference, digest: str, *, max_bytes: int = DEFAULT_MAX_BLOB_BYTES) -> bytes:
        check_digest(digest)
        what = f"blob {ref.name}@{digest}"
        cache_key = (ref.api_host, ref.repository, digest)
        if (hit := self._cache.get(cache_key)) is not None:
            if len(hit[0]) > max_bytes:
                raise RegistryProtocolError(f"{what}: {len(hit[0])} bytes is over the {max_bytes}-byte limit")
            return hit[0]
        with self._op(ref.api_host, what):
            resp = self._request("GET", ref, f"blobs/{digest}", what=what, stream=True)
            data = self._read(resp, max_bytes, what=what)
            if sha256_digest(data) != digest:
                raise RegistryProtocolError(
                    f"{what}: registry sent content with digest {sha256_digest(data)}"
                )
        self._remember(cache_key, data)
        return data

    def has_blob(self, ref: Reference, digest: str) -> bool:
        what = f"blob {ref.name}@{digest}"
        try:
            with self._op(ref.api_host, what):
                self._request("HEAD", ref, f"blobs/{check_digest(digest)}", what=what)
        except RegistryNotFound:
            return False
        return True

    def put_blob(self, ref: Reference, data: bytes) -> str:
        """Upload ``data`` (monolithic POST+PUT) unless the registry has it; returns its digest."""
        digest = sha256_digest(data)
        return self._upload(ref, digest, lambda: data, len(data))

    def put_blob_stream(self, ref: Reference, digest: str, size: int, body: Callable[[], Any]) -> str:
        """``put_blob`` of a blob too large to hold in memory (a snapshot's layer, made as it is
        read): ``body()`` gives something to read ``size`` bytes from, asked for only when the
        registry lacks the blob, which checks ``digest`` on commit."""
        return self._upload(ref, digest, body, size)

    def _upload(self, ref: Reference, digest: str, body: Callable[[], Any], size: int) -> str:
        """The monolithic POST+PUT both uploads share; ``body`` is asked for only when the
        registry lacks the blob."""
        what = f"upload blob {ref.name}@{digest}"
        with self._op(ref.api_host, what, upload_seconds(self.timeout, size)):
            if self.has_blob(ref, digest):
                return digest
            resp = self._request("POST", ref, "blobs/uploads/", what=what, ok=(202,))
            location = resp.headers.get("Location")
            resp.close()
            if not location:
                raise RegistryProtocolError(f"{what}: no upload Location")
            url = urljoin(f"{self._base(ref.api_host)}/v2/{ref.repository}/blobs/uploads/", location)
            sep = "&" if "?" in url else "?"
            resp = self._request(
                "PUT",
                ref,
                f"{url}{sep}digest={digest}",
                what=what,
                ok=(201, 204),
                headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                data=body(),
            )
            resp.close()
            return digest

    # -- referrers ----------------------------------------------------------------------

    def referrers(self, subject: Reference, *, artifact_type: str | None = None) -> list[Descriptor]:
        """Manifests whose ``subject`` is ``subject.digest``, from the API or the fallback tag
        (``referrer_listing``'s entries)."""
        return list(self.referrer_listing(subject, artifact_type=artifact_type).entries)

    def referrer_listing(self, subject: Reference, *, artifact_type: str | None = None) -> Listing:
        """The referrers of ``subject.digest``, every page the API links (``rel="next"``, on the
        same host), or the fallback tag's index, within ``listing.MAX_PAGES`` pages and
        ``listing.MAX_BYTES`` bytes in all: past them, what was read, and ``cut`` says so."""
        digest = subject.digest
        if digest is None:
            raise RegistryProtocolError(f"referrers of {subject}: a digest is needed")
        with self._op(subject.api_host, f"referrers of {subject.name}@{digest}"):
            host = subject.api_host
            found: Listing | None = None
            if self._referrers_api.get(host, True):
                found = self._referrers_from_api(subject, digest, artifact_type)
                self._referrers_api[host] = found is not None
            if found is None:
                found = self._referrers_from_tag(subject, digest)
            if artifact_type:
                kept = tuple(e for e in found.entries if e.artifact_type == artifact_type)
                found = dataclasses.replace(found, entries=kept)
            return found

    def _page(
        self, resp: requests.Response, budget: int, *, what: str
    ) -> tuple[list[Descriptor], int, bool, int]:
        """(entries, malformed, cut, bytes read) of one listing document, read to ``budget``."""
        data, cut = self._read_prefix(resp, budget, what=what)
        entries, malformed = descriptors(index_entries(data, complete=not cut, source=what), source=what)
        return entries, malformed, cut, len(data)

    def _referrers_from_api(
        self, subject: Reference, digest: str, artifact_type: str | None
    ) -> Listing | None:
        what = f"referrers listing of {subject.name}@{digest}"
        params = {"artifactType": artifact_type} if artifact_type else None
        # OCI 1.1 says a registry without the API answers 404; some answer 400 or 405 instead.
        resp = self._request(
            "GET",
            subject,
            f"referrers/{digest}",
            what=what,
            ok=(200, 400, 404, 405),
            headers={"Accept": OCI_INDEX},
            params=params,
            stream=True,
        )
        if resp.status_code != 200 or _content_type(resp) != OCI_INDEX:
            resp.close()
            return None
        entries: list[Descriptor] = []
        malformed = read = 0
        for page in range(1, MAX_PAGES + 1):
            url = resp.url or ""
            found, bad, cut, size = self._page(resp, MAX_BYTES - read, what=f"{what} (page {page})")
            entries += found
            malformed += bad
            read += size
            if cut:
                return Listing(tuple(entries), f"{what} exceeds {bound_text()}", malformed)
            link = resp.links.get("next", {}).get("url")
            if not link:
                return Listing(tuple(entries), None, malformed)
            nxt = urljoin(url, link)
            here, there = urlsplit(self._base(subject.api_host)), urlsplit(nxt)
            if (there.scheme, there.netloc) != (here.scheme, here.netloc):
                # The next page is the registry's to serve: one elsewhere could list anything.
                raise RegistryProtocolError(
                    f"{what}: page {page} links its next page on another host ({_shown_url(nxt)}); not followed"
                )
            if page == MAX_PAGES:
                break
            resp = self._request("GET", subject, nxt, what=what, headers={"Accept": OCI_INDEX}, stream=True)
            if _content_type(resp) != OCI_INDEX:
                resp.close()
                raise RegistryProtocolError(f"{what}: page {page + 1} is not an OCI index")
        return Listing(tuple(entries), f"{what} exceeds {bound_text()}", malformed)

    def _referrers_from_tag(self, subject: Reference, digest: str) -> Listing:
        # Read here, not by get_manifest: the index may be larger than a manifest may be, and
        # what lies whole before the byte bound is still used.
        tag = fallback_tag(digest)
        what = f"referrers listing of {subject.name}@{digest} (fallback tag {tag})"
        try:
            resp = self._request(
                "GET", subject, f"manifests/{tag}", what=what, headers={"Accept": OCI_INDEX}, stream=True
            )
        except RegistryNotFound:
            return Listing(())
        declared = _content_type(resp)
        entries, malformed, cut, _ = self._page(resp, MAX_BYTES, what=what)
        if declared != OCI_INDEX:
            raise RegistryProtocolError(f"{what}: the fallback tag does not hold an OCI index")
        return Listing(tuple(entries), f"{what} exceeds {MAX_BYTES >> 20} MiB" if cut else None, malformed)

    def push_referrer(self, subject: Reference, data: bytes, media_type: str) -> str:
        """Push a manifest whose ``subject`` is ``subject.digest``, and list it in the fallback
        index when the registry did not index it itself. Returns the manifest's digest."""
        digest = subject.digest
        if digest is None:
            raise RegistryProtocolError(f"push referrer of {subject}: a digest is needed")
        with self._op(subject.api_host, f"push referrer of {subject.name}@{digest}"):
            manifest = Manifest.from_bytes(data, media_type, source=f"referrer of {subject.pinned()}")
            pushed = self.put_manifest(dataclasses.replace(subject, tag=None, digest=None), data, media_type)
            if pushed.subject_indexed:
                return pushed.digest
            tag_ref = subject.with_tag(fallback_tag(digest))
            try:
                current = self.get_manifest(tag_ref, accept=(OCI_INDEX,), max_bytes=MAX_BYTES)
                entries = [d.to_json() for d in current.manifests if d.digest != pushed.digest]
                doc: dict[str, Any] = dict(current.doc)
            except RegistryNotFound:
                entries, doc = [], {"schemaVersion": 2, "mediaType": OCI_INDEX}
            entries.append(manifest.descriptor().to_json())
            doc["manifests"] = entries
            self.put_manifest(tag_ref, encode_json(doc), OCI_INDEX)
            return pushed.digest
