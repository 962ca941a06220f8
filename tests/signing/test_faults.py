"""``kernelbake verify`` and ``inspect`` against a registry that fails in each way the fault
proxy knows: one line and the cause's exit code, within the deadline, and never "verified".

Drips send a byte every 0.25 s, well inside any per-read timeout: only a total deadline ends
them (the whole answer would take minutes). The elapsed-time assertions are the deadline's
correctness bound (deadline plus a margin for scheduling), not speed targets.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.errors import EnvironmentProblem, KernelbakeError, RegistryError
from kernelbake.oci import DeadlineExceeded, RegistryClient, parse_reference
from kernelbake.signing import errors as E
from kernelbake.signing.sign import sign_image
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import PushedImage
from tests.support.faults import Drip, Fault, Reply, fault_rule, proxy

pytestmark = pytest.mark.registry

DEADLINE = 1.5
# Scheduling on a busy 2-core machine; the watchdog itself fires at the deadline.
MARGIN = 1.0

# What verify says for each fault, and the words that say why.
EXPECTED: dict[Fault, tuple[type[KernelbakeError], str]] = {
    Fault.SERVER_ERROR: (E.RegistryServerFailure, "503"),
    Fault.HANG: (E.RegistryTimeout, f"did not finish within {DEADLINE:g}s"),
    Fault.DRIP: (E.RegistryTimeout, f"did not finish within {DEADLINE:g}s"),
    Fault.DRIP_BODY: (E.RegistryTimeout, f"did not finish within {DEADLINE:g}s"),
    Fault.RESET: (E.RegistryTimeout, "broke (connection reset)"),
    Fault.TRUNCATE: (E.RegistryTimeout, "transfer broke off"),
    Fault.WRONG_DIGEST: (E.RegistryMisbehaved, "registry sent content with digest"),
}


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))


@pytest.fixture
def signed(make_image: ImageFactory, client: RegistryClient, keys: KeyPair) -> tuple[PushedImage, bytes]:
    """A signed image, and the manifest of another (unsigned) kernelbake image to serve in its
    place for the wrong-digest fault."""
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    impostor = make_image()
    return image, client.get_manifest(impostor.ref.with_digest(impostor.digest)).data


def one_line(err: str, command: str) -> str:
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert lines[0].startswith(f"kernelbake {command}: error: ")
    assert "Traceback" not in err
    return lines[0]


def test_the_proxy_forwards_what_it_does_not_fault(
    registry: str, signed: tuple[PushedImage, bytes], keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    image, _ = signed
    with proxy(registry, lambda method, path: None) as p:
        ref = f"{p.address}/{image.ref.repository}@{image.digest}"
        assert main(["verify", ref, "--key", str(keys.public_path), "--timeout", str(DEADLINE)]) == 0
    assert capsys.readouterr().out.startswith("verified ")
    assert p.requests > 0 and p.faulted == 0


@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.value)
def test_verify_under_fault(
    fault: Fault,
    registry: str,
    signed: tuple[PushedImage, bytes],
    keys: KeyPair,
    capsys: pytest.CaptureFixture[str],
) -> None:
    image, impostor = signed
    expected, reason = EXPECTED[fault]
    with proxy(registry, fault_rule(fault, substitute=impostor)) as p:
        # By digest: the first request is the one a wrong-digest registry answers wrongly.
        ref = f"{p.address}/{image.ref.repository}@{image.digest}"
        started = time.monotonic()
        rc = main(["verify", ref, "--key", str(keys.public_path), "--timeout", str(DEADLINE)])
        elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    line = one_line(err, "verify")
    assert p.faulted > 0, "the fault was never injected"
    assert rc == expected.return_code, line
    assert reason in line
    assert p.address in line
    assert "verified" not in out.lower()
    assert elapsed < DEADLINE + MARGIN, f"{fault.value}: {elapsed:.2f}s for a {DEADLINE}s deadline"


@pytest.mark.parametrize("fault", [Fault.HANG, Fault.DRIP, Fault.DRIP_BODY], ids=lambda f: f.value)
def test_inspect_under_fault(
    fault: Fault, registry: str, signed: tuple[PushedImage, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    image, _ = signed
    with proxy(registry, fault_rule(fault)) as p:
        started = time.monotonic()
        rc = main(["inspect", f"{p.address}/{image.ref.repository}:v1", "--timeout", str(DEADLINE)])
        elapsed = time.monotonic() - started
    line = one_line(capsys.readouterr().err, "inspect")
    # inspect reads an unreachable registry as the environment's problem (start it, fix the address).
    assert rc == EnvironmentProblem.return_code, line
    assert f"did not finish within {DEADLINE:g}s" in line
    assert elapsed < DEADLINE + MARGIN


def test_a_sequence_of_calls_shares_one_deadline(registry: str, signed: tuple[PushedImage, bytes]) -> None:
    """``client.deadline`` bounds all calls inside it together: each drips for less than the
    per-call timeout, and the sequence still ends at the outer bound."""
    image, _ = signed
    # One byte every 0.25 s of the body only: each call takes ~0.25 s per byte; a per-call
    # bound of 10 s alone would let verification run for minutes.
    with proxy(registry, lambda m, path: Drip(0.25, body_only=True) if "/blobs/" in path else None) as p:
        client = RegistryClient(timeout=10.0)
        ref = parse_reference(f"{p.address}/{image.ref.repository}").with_digest(image.digest)
        started = time.monotonic()
        with (
            pytest.raises(DeadlineExceeded, match=r"within 1\.5s \(verification deadline\)"),
            client.deadline(DEADLINE, "verification deadline"),
        ):
            manifest = client.get_manifest(ref)
            client.get_blob(ref, manifest.config.digest)
        elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + MARGIN


def test_token_exchange_is_inside_the_deadline(registry: str, signed: tuple[PushedImage, bytes]) -> None:
    """A registry that sends us to a token service that drips: the call still ends in time, and
    the message says whom it was waiting for."""
    image, _ = signed
    token_body = b'{"token": "' + b"t" * 200 + b'"}'
    with proxy(registry, lambda m, path: Drip(0.25, reply=Reply(200, token_body))) as tokens:
        challenge = f'Bearer realm="http://{tokens.address}/token",service="kb"'
        with proxy(registry, lambda m, path: Reply(401, b"{}", {"WWW-Authenticate": challenge})) as p:
            client = RegistryClient(timeout=DEADLINE)
            ref = parse_reference(f"{p.address}/{image.ref.repository}").with_digest(image.digest)
            started = time.monotonic()
            with pytest.raises(DeadlineExceeded) as caught:
                client.get_manifest(ref)
            elapsed = time.monotonic() - started
    message = str(caught.value)
    assert message.startswith(f"{p.address}: GET manifest ")
    assert f"did not finish within {DEADLINE:g}s (waiting for {tokens.address})" in message
    assert tokens.faulted == 1
    assert elapsed < DEADLINE + MARGIN


@pytest.mark.parametrize("fault", [Fault.HANG, Fault.DRIP_BODY], ids=lambda f: f.value)
def test_sign_under_fault(
    fault: Fault,
    registry: str,
    make_image: ImageFactory,
    keys: KeyPair,
    capsys: pytest.CaptureFixture[str],
) -> None:
    image = make_image()
    with proxy(registry, fault_rule(fault)) as p:
        started = time.monotonic()
        rc = main(
            [
                "sign",
                "--key",
                str(keys.private_path),
                f"{p.address}/{image.ref.repository}:v1",
                "--timeout",
                str(DEADLINE),
            ]
        )
        elapsed = time.monotonic() - started
    line = one_line(capsys.readouterr().err, "sign")
    assert rc == RegistryError.return_code, line
    assert f"did not finish within {DEADLINE:g}s" in line and p.address in line
    assert elapsed < DEADLINE + MARGIN
