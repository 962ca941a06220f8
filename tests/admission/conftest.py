from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelbake.admission.http.server import AdmissionServer
from kernelbake.admission.large_bodies import BodyBudget
from kernelbake.admission.service import Admitter
from kernelbake.contract.key import CacheKey
from kernelbake.plan import plan
from kernelbake.spec import load_spec
from tests.admission.fakes import REPO, FakeVerifier
from tests.conftest import REPO as SOURCE_TREE


@pytest.fixture(scope="session")
def keys() -> dict[str, CacheKey]:
    """Real keys, as ``kernelbake plan`` computes them, for each GPU target of qwen3-0.6b."""
    spec = load_spec(SOURCE_TREE / "images" / "qwen3-0.6b.yaml")
    return {t.gpu.name: t.key for t in plan(spec, ["all"], registry="r")}


@pytest.fixture
def verifier(keys: dict[str, CacheKey]) -> Iterator[FakeVerifier]:
    v = FakeVerifier()
    v.add(f"{REPO}:h100", keys["h100"])
    v.add(f"{REPO}:a100", keys["a100-80gb"])
    yield v
    if v.gate is not None:
        v.gate.set()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a serving certificate for 127.0.0.1 and the API server's client certificate, made
    by deploy/make-cert.sh."""
    out = tmp_path_factory.mktemp("certs")
    subprocess.run(
        [str(SOURCE_TREE / "deploy" / "make-cert.sh"), "--out", str(out), "--ip", "127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return out


@contextlib.contextmanager
def running_server(
    admitter: Admitter,
    certs: Path,
    *,
    bodies: BodyBudget | None = None,
    max_connections: int | None = None,
    **options: Any,
) -> Iterator[int]:
    """The real AdmissionServer on 127.0.0.1 in a thread of its own; yields the port. It takes
    only clients with the certificate ``certs`` holds for the API server, as deployed, unless
    ``options`` say otherwise (``unsafe_any_client``); more of AdmissionServer's: ``health_sock``."""
    if not options.get("unsafe_any_client"):
        options.setdefault("client_ca", certs / "ca.crt")
    server = AdmissionServer(
        admitter,
        cert=certs / "tls.crt",
        key=certs / "tls.key",
        host="127.0.0.1",
        port=0,
        bodies=bodies,
        **({} if max_connections is None else {"max_connections": max_connections}),
        **options,
    )
    loop = asyncio.new_event_loop()
    port = loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
