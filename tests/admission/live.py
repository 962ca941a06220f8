"""The real parts for integration tests and the benchmark: kernelbake-shaped images for GPU
targets pushed to the local docker-registry and signed by ``kernelbake sign``, an admission
policy trusting the signing key, and ``kernelbake admission`` running as a process."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.oci import RegistryClient
from kernelbake.plan import plan
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.signing.images import PushedImage, push_image

KERNELBAKE = [sys.executable, "-m", "kernelbake"]
SPEC = REPO / "images" / "qwen3-0.6b.yaml"


def client_tls(certs: Path, *, client: bool = True) -> ssl.SSLContext:
    """A client's TLS context trusting the webhook's CA; it shows the API server's client
    certificate (which the webhook requires, as deployed) unless ``client`` is False. Here, not
    in conftest, so that the benches that use this module import no server code: an A/B runs
    them against another revision's ``src``, whose modules may sit elsewhere."""
    tls = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    if client:
        tls.load_cert_chain(certs / "client.crt", certs / "client.key")
    return tls


def kernelbake(
    *args: str, check: bool = True, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, **(env or {})}
    done = subprocess.run(
        [*KERNELBAKE, *args], capture_output=True, text=True, input=stdin, timeout=120, env=environ
    )
    if check and done.returncode:
        raise RuntimeError(f"kernelbake {' '.join(args)} failed ({done.returncode}): {done.stderr}")
    return done


def generate_key(directory: Path, name: str) -> tuple[Path, Path]:
    kernelbake("generate-key-pair", "--dir", str(directory), "--name", name)
    return directory / f"{name}.key", directory / f"{name}.pub"


def push_target(
    registry: str, repository: str, tag: str, gpu: str, workdir: Path, *, salt: str = ""
) -> PushedImage:
    """Push a kernelbake-shaped image of qwen3-0.6b for ``gpu`` (labels and key from ``plan``)."""
    target = next(t for t in plan(load_spec(SPEC), [gpu], registry=registry) if t.gpu.name == gpu)
    client = RegistryClient(timeout=30)
    return push_image(client, f"{registry}/{repository}:{tag}", workdir, target=target, salt=salt or tag)


def sign(image: PushedImage, key: Path) -> None:
    kernelbake("sign", "--key", str(key), image.tagged)


def write_policy(
    path: Path, patterns: Sequence[str], trust: Path | Mapping[str, object], **extra: object
) -> Path:
    """An admission policy governing ``patterns``, trusting a public key file or a ``verify:``
    mapping (identities)."""
    verify = {"keys": [str(trust)]} if isinstance(trust, Path) else trust
    doc = {"images": list(patterns), "verify": verify, **extra}
    path.write_text(json.dumps(doc, indent=2))  # JSON is YAML
    return path


@dataclasses.dataclass
class Served:
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def serving(
    policy: Path,
    certs: Path,
    *,
    log_level: str = "info",
    workers: int = 1,
    wrap: Sequence[str] = (),
    options: Sequence[str] = (),
    client_ca: bool = True,
) -> Iterator[Served]:
    """``kernelbake admission`` on 127.0.0.1, a free port, its stderr in a file beside the
    policy (no reader thread competing with the caller); stops it with SIGTERM. ``wrap``: a
    command that runs the server's (a memory cgroup to join first, say). As deployed, it takes
    only the API server's client certificate (``certs``' CA), unless ``options`` say
    ``--unsafe-any-client`` or name another ``--client-ca``; ``client_ca=False`` passes neither,
    for a server from before ``--client-ca`` (a load A/B's other side, by PYTHONPATH)."""
    given = {"--unsafe-any-client", "--client-ca"} & set(options)
    clients = ["--client-ca", str(certs / "ca.crt")] if client_ca and not given else []
    log_path = policy.with_suffix(".server.log")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                *wrap,
                *KERNELBAKE,
                "admission",
                "--policy",
                str(policy),
                "--tls-cert",
                str(certs / "tls.crt"),
                "--tls-key",
                str(certs / "tls.key"),
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--log-level",
                log_level,
                "--workers",
                str(workers),
                *clients,
                *options,
            ],
            stderr=log,
            stdout=subprocess.DEVNULL,
        )
    served = Served(0, proc, log_path)
    deadline = time.monotonic() + 60
    while not served.port:
        found = re.search(r"listening on https://127\.0\.0\.1:(\d+)", served.log)
        if found:
            served.port = int(found.group(1))
        elif proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("kernelbake admission did not start:\n" + served.log)
        else:
            time.sleep(0.05)
    try:
        yield served
    finally:
        proc.terminate()
        proc.wait(30)


def post_review(port: int, certs: Path, path: str, doc: Any) -> dict[str, Any]:
    """POST the AdmissionReview ``doc`` to the webhook on 127.0.0.1:``port`` over TLS (its CA
    in ``certs``); the answer, after checking it is a 200 that echoes the request's uid."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=client_tls(certs), timeout=30)
    try:
        conn.request("POST", path, body=json.dumps(doc), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200, r.read()
        answer: dict[str, Any] = json.loads(r.read())
    finally:
        conn.close()
    assert answer["response"]["uid"] == doc["request"]["uid"]
    return answer
