"""docker-registry instances that demand credentials: htpasswd (HTTP Basic) and token auth
(HTTP Bearer, with a small token service here that checks Basic credentials and signs JWTs)."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

from tests.support.registry import running_registry

USER, PASSWORD = "kb", "s3cret"
# bcrypt of PASSWORD (docker-registry's htpasswd accepts bcrypt only).
HTPASSWD = f"{USER}:$2b$05$B0E84kDWqRZObZ6B4Slyn.tHPxNlBcS51cDeEpSDJhFakxcY62XiG\n"
SERVICE, ISSUER = "kernelbake-tests", "kernelbake-test-tokens"


@contextlib.contextmanager
def basic_auth_registry(workdir: Path) -> Iterator[str]:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "htpasswd").write_text(HTPASSWD)
    auth = f"auth:\n  htpasswd:\n    realm: {SERVICE}\n    path: {workdir / 'htpasswd'}\n"
    with running_registry(workdir, auth=auth) as addr:
        yield addr


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class _TokenIssuer:
    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.issued = 0

    def token(self, scope: str, subject: str) -> str:
        access = []
        for item in scope.split(" "):
            kind, _, rest = item.partition(":")
            name, _, actions = rest.rpartition(":")
            if kind == "repository" and name:
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {
            "alg": "ES256",
            "typ": "JWT",
            "x5c": [base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode()],
        }
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        self.issued += 1
        return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


@contextlib.contextmanager
def token_auth_registry(workdir: Path) -> Iterator[tuple[str, _TokenIssuer]]:
    """A registry that wants Bearer tokens, and the token service (Basic-authenticated) it trusts."""
    issuer = _TokenIssuer()
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.end_headers()
                return
            body = json.dumps({"token": issuer.token(" ".join(query.get("scope", [])), USER)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workdir.mkdir(parents=True, exist_ok=True)
    bundle = workdir / "token-ca.pem"
    bundle.write_bytes(issuer.cert.public_bytes(serialization.Encoding.PEM))
    auth = (
        "auth:\n  token:\n"
        f"    realm: http://127.0.0.1:{server.server_address[1]}/token\n"
        f"    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {bundle}\n"
    )
    try:
        with running_registry(workdir, auth=auth) as addr:
            yield addr, issuer
    finally:
        server.shutdown()
        server.server_close()


def write_docker_config(directory: Path, host: str, *, helper: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if helper:
        doc: dict[str, object] = {"credHelpers": {host: helper}}
    else:
        doc = {"auths": {host: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}
    (directory / "config.json").write_text(json.dumps(doc))
    return directory
