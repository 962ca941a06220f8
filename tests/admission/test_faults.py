"""Admission against a registry that fails in each way the fault proxy knows: the review is
denied with a one-line reason by the policy's deadline, the verification job itself ends by
then too (it does not run on after the answer), and nothing is admitted that should not be: a
registry serving other content for a signed digest is a rejection, never an admission.

The elapsed-time assertions are the deadline's correctness bound (deadline plus a margin for
scheduling), not speed targets.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from kernelbake.admission.gateway import ImageRejected, RegistryUnavailable
from kernelbake.admission.policy import load_admission_policy
from kernelbake.admission.verifying import SignedImageVerifier, verify_policy
from kernelbake.cli import main
from kernelbake.errors import KernelbakeError
from kernelbake.oci import RegistryClient
from kernelbake.settings import Settings
from kernelbake.signing.keys import generate_key_pair, load_private_key
from kernelbake.signing.sign import sign_image
from kernelbake.signing.signer import KeySigner
from tests.admission import documents, live
from tests.signing.images import PushedImage
from tests.support.faults import Fault, fault_rule, proxy

pytestmark = pytest.mark.registry

DEADLINE = 1.5
MARGIN = 1.0
REPOSITORY = "kernelbake/qwen3-0.6b-faults"

# What the verification job raises for each fault, and the words of its reason.
EXPECTED: dict[Fault, tuple[type[KernelbakeError], str]] = {
    Fault.SERVER_ERROR: (RegistryUnavailable, "503"),
    Fault.HANG: (RegistryUnavailable, f"did not finish within {DEADLINE:g}s"),
    Fault.DRIP: (RegistryUnavailable, f"did not finish within {DEADLINE:g}s"),
    Fault.DRIP_BODY: (RegistryUnavailable, f"did not finish within {DEADLINE:g}s"),
    Fault.RESET: (RegistryUnavailable, "broke (connection reset)"),
    Fault.TRUNCATE: (RegistryUnavailable, "transfer broke off"),
    Fault.WRONG_DIGEST: (ImageRejected, "registry sent content with digest"),
}


@dataclasses.dataclass(frozen=True)
class Signed:
    image: PushedImage
    public_key: Path
    impostor: bytes  # the manifest of an unsigned image of the same shape


@pytest.fixture(scope="module")
def signed(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Signed:
    tmp = tmp_path_factory.mktemp("admission-faults")
    private, public = generate_key_pair(tmp / "keys", name="trusted")
    client = RegistryClient(Settings(docker_config=tmp / "docker-config"), timeout=30)
    image = live.push_target(registry, REPOSITORY, "h100", "h100", tmp / "h100")
    sign_image(image.tagged, KeySigner(load_private_key(private)), client=client)
    impostor = live.push_target(registry, REPOSITORY, "impostor", "h100", tmp / "impostor")
    return Signed(image, public, client.get_manifest(impostor.ref.with_digest(impostor.digest)).data)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))


def review(
    tmp_path: Path, address: str, signed: Signed, capsys: pytest.CaptureFixture[str], **policy_fields: object
) -> tuple[int, dict[str, object], str, float]:
    """``kernelbake admission review`` of a pod running the signed image by digest through
    ``address``; (exit code, response, stderr, seconds)."""
    policy = live.write_policy(
        tmp_path / "policy.yaml",
        [f"{address}/kernelbake/**"],
        signed.public_key,
        deadline_seconds=DEADLINE,
        **policy_fields,
    )
    request = tmp_path / "request.json"
    image = f"{address}/{REPOSITORY}@{signed.image.digest}"
    request.write_text(json.dumps(documents.load("pod-create", image)))
    started = time.monotonic()
    rc = main(["admission", "review", "--policy", str(policy), str(request)])
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    response: dict[str, object] = json.loads(out)["response"]
    return rc, response, err, elapsed


def test_the_proxy_forwards_what_it_does_not_fault(
    registry: str, signed: Signed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with proxy(registry, lambda method, path: None) as p:
        rc, response, err, _ = review(tmp_path, p.address, signed, capsys)
    assert (rc, response["allowed"], err) == (0, True, ""), response
    assert p.requests > 0 and p.faulted == 0


@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.value)
def test_review_under_fault_is_denied_in_time(
    fault: Fault, registry: str, signed: Signed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with proxy(registry, fault_rule(fault, substitute=signed.impostor)) as p:
        rc, response, err, elapsed = review(tmp_path, p.address, signed, capsys)
    assert p.faulted > 0, "the fault was never injected"
    assert response["allowed"] is False, response
    assert rc == 1
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("denied: kernelbake admission: "), err
    assert "Traceback" not in err
    status = response["status"]
    assert isinstance(status, dict)
    if fault is Fault.WRONG_DIGEST:
        # The registry answered, wrongly: a rejection (403), whatever registry_errors says.
        assert status["code"] == 403 and "registry sent content with digest" in status["message"]
    else:
        assert status["code"] == 503  # could not verify: "try again", not "bad image"
    # The verification gives up just before the review's deadline: the answer says why, in the
    # registry's words, rather than only that time ran out.
    _, reason = EXPECTED[fault]
    if fault in (Fault.HANG, Fault.DRIP, Fault.DRIP_BODY):
        reason = f"{p.address}: GET manifest "
    assert reason in str(status["message"]), status["message"]
    assert elapsed < DEADLINE + MARGIN, f"{fault.value}: {elapsed:.2f}s for a {DEADLINE}s deadline"


def test_a_wrong_digest_is_rejected_even_where_outages_are_admitted(
    registry: str, signed: Signed, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``registry_errors: unsafe-allow`` admits what could not be checked; content that does
    not match its digest was checked, and failed."""
    with proxy(registry, fault_rule(Fault.HANG)) as p:
        _, response, _, _ = review(tmp_path, p.address, signed, capsys, registry_errors="unsafe-allow")
    assert response["allowed"] is True, response  # the permissive setting does what it says
    rule = fault_rule(Fault.WRONG_DIGEST, substitute=signed.impostor)
    with proxy(registry, rule) as p:
        rc, response, _, _ = review(tmp_path, p.address, signed, capsys, registry_errors="unsafe-allow")
    assert (rc, response["allowed"]) == (1, False), response


@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.value)
def test_verification_job_ends_by_the_deadline(
    fault: Fault, registry: str, signed: Signed, tmp_path: Path
) -> None:
    """The verifier the gateway runs, with its reason: it gives up by the deadline on its own,
    so a slow registry does not keep a worker busy after the review was answered."""
    expected, reason = EXPECTED[fault]
    with proxy(registry, fault_rule(fault, substitute=signed.impostor)) as p:
        policy = load_admission_policy(
            live.write_policy(tmp_path / "policy.yaml", [f"{p.address}/kernelbake/**"], signed.public_key)
        )
        verifier = SignedImageVerifier(
            verify_policy(policy), settings=Settings(docker_config=tmp_path / "dc"), timeout=DEADLINE
        )
        started = time.monotonic()
        with pytest.raises(expected) as caught:
            verifier(f"{p.address}/{REPOSITORY}@{signed.image.digest}")
        elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "\n" not in message and reason in message, message
    assert p.address in message
    assert elapsed < DEADLINE + MARGIN, f"{fault.value}: {elapsed:.2f}s for a {DEADLINE}s deadline"


def test_tag_resolution_ends_by_the_deadline(registry: str, signed: Signed, tmp_path: Path) -> None:
    """The gateway's tag → digest lookup is bounded the same way."""
    with proxy(registry, fault_rule(Fault.DRIP)) as p:
        policy = load_admission_policy(
            live.write_policy(tmp_path / "policy.yaml", [f"{p.address}/kernelbake/**"], signed.public_key)
        )
        verifier = SignedImageVerifier(
            verify_policy(policy), settings=Settings(docker_config=tmp_path / "dc"), timeout=DEADLINE
        )
        started = time.monotonic()
        with pytest.raises(RegistryUnavailable, match=f"did not finish within {DEADLINE:g}s"):
            verifier.resolve(f"{p.address}/{REPOSITORY}:h100")
        elapsed = time.monotonic() - started
    assert elapsed < DEADLINE + MARGIN
