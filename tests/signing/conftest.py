"""Fixtures for the signing tests: the registry images go to, key pairs, kernelbake-shaped
images, the local Sigstore (``@sigstore/mock`` behind node) and cosign binaries.

``make_image`` pushes to ``image_registry``: the real docker-registry by default; unit-test
modules of the signing logic override it with ``memory_registry`` (no binary needed).

Nothing here skips: a missing tool fails the test with the command that installs it
(``scripts/setup-signing-deps.sh``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelbake.oci import RegistryClient
from kernelbake.settings import Settings
from kernelbake.signing.keys import (
    PrivateKey,
    PublicKey,
    generate_key_pair,
    load_private_key,
    load_public_key_file,
)
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.signer import KeySigner
from tests.conftest import REPO
from tests.signing.images import PushedImage, push_image
from tests.support.memregistry import memory_registry as _memory_registry

SETUP = "scripts/setup-signing-deps.sh"
MOCKSERVER = REPO / "tests/signing/mockserver"
COSIGN3_DEFAULT = "/opt/kernelbake/cosign3/usr/bin/cosign"


def need(path: str | None, what: str) -> str:
    if not path or not Path(path).exists():
        pytest.fail(f"{what} is missing: run {SETUP}", pytrace=False)
    return path


@pytest.fixture(scope="session")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    # An empty docker config: tests must not pick up the host's credentials.
    return Settings(docker_config=tmp_path_factory.mktemp("docker-config"))


@pytest.fixture(scope="session")
def client(settings: Settings) -> RegistryClient:
    return RegistryClient(settings, timeout=10.0)


class KeyPair:
    def __init__(self, directory: Path, name: str) -> None:
        self.private_path, self.public_path = generate_key_pair(directory, name=name)
        self.private: PrivateKey = load_private_key(self.private_path)
        self.public: PublicKey = load_public_key_file(self.public_path)
        self.signer = KeySigner(self.private)

    def policy(self, **extra: Any) -> VerifyPolicy:
        return VerifyPolicy.from_mapping({"keys": [str(self.public_path)], **extra}, source="test-policy")


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return KeyPair(tmp_path_factory.mktemp("keys"), "kernelbake")


@pytest.fixture(scope="session")
def other_keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return KeyPair(tmp_path_factory.mktemp("other-keys"), "intruder")


ImageFactory = Callable[..., PushedImage]


@pytest.fixture(scope="session")
def memory_registry() -> Iterator[str]:
    """``127.0.0.1:<port>`` of an in-memory registry (tests/support/memregistry.py)."""
    with _memory_registry() as (addr, _):
        yield addr


@pytest.fixture(scope="session")
def image_registry(registry: str) -> str:
    """Where ``make_image`` pushes; a module testing signing logic overrides it (see above)."""
    return registry


@pytest.fixture
def make_image(image_registry: str, client: RegistryClient, tmp_path: Path) -> ImageFactory:
    """Push a fresh kernelbake-shaped image to its own repository; returns it."""
    counter = iter(range(1000))

    def make(tag: str = "v1", repo: str | None = None, **kw: Any) -> PushedImage:
        n = next(counter)
        name = repo or f"kb/{uuid.uuid4().hex[:10]}"
        return push_image(
            client, f"{image_registry}/{name}:{tag}", tmp_path / f"img{n}", salt=f"{name}{n}", **kw
        )

    return make


# -- local Sigstore -----------------------------------------------------------------------


class MockSigstore:
    """``node server.js``: a Fulcio CA and Rekor log on 127.0.0.1, writing a trusted root and a
    client trust config pointing at itself."""

    def __init__(self, workdir: Path) -> None:
        node = need(shutil.which("node"), "node")
        need(str(MOCKSERVER / "node_modules/@sigstore/mock/package.json"), "@sigstore/mock (npm ci)")
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self._log = (workdir / "mockserver.log").open("w")
        self.proc = subprocess.Popen(
            [node, str(MOCKSERVER / "server.js"), "--out", str(workdir)],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.stop()
            pytest.fail(
                f"mock sigstore server did not start; see {workdir / 'mockserver.log'}", pytrace=False
            )
        info = json.loads(line)
        self.url: str = info["url"]
        self.trusted_root = Path(info["trusted_root"])
        self.trust_config = Path(info["trust_config"])

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@contextlib.contextmanager
def mock_sigstore(workdir: Path) -> Iterator[MockSigstore]:
    server = MockSigstore(workdir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sigstore_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockSigstore]:
    with mock_sigstore(tmp_path_factory.mktemp("sigstore-mock")) as server:
        yield server


ISSUER = "https://ci.kernelbake.test"
SUBJECT = "https://ci.kernelbake.test/acme/images/.github/workflows/build.yml@refs/heads/main"


def _b64url(doc: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def make_token(
    *, subject: str = SUBJECT, issuer: str = ISSUER, lifetime: int = 600, age: int = 0, **claims: Any
) -> str:
    """An OIDC identity token as a CI provider would mint it (the mock CA does not check its
    signature; real Fulcio would)."""
    now = int(time.time()) - age
    body = {"iss": issuer, "sub": subject, "aud": "sigstore", "iat": now, "nbf": now, "exp": now + lifetime}
    body.update(claims)
    return f"{_b64url({'alg': 'ES256', 'typ': 'JWT'})}.{_b64url(body)}.c2lnbmF0dXJl"


# -- cosign -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cosign2() -> str:
    return need(shutil.which("cosign"), "cosign 2.5.0 (Debian trixie)")


@pytest.fixture(scope="session")
def cosign3() -> str:
    return need(os.environ.get("KERNELBAKE_TEST_COSIGN3", COSIGN3_DEFAULT), "cosign 3.1.1 (Debian sid)")


def cosign(binary: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "COSIGN_PASSWORD": "", "COSIGN_YES": "true", **(env or {})}
    return subprocess.run([binary, *args], capture_output=True, text=True, env=full_env, timeout=120)
