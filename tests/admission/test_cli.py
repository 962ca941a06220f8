"""`kernelbake admission` bad input: one line naming file:field (or flag), exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbake.cli import main

TRUST = (
    "verify: {identities: [{issuer: https://ci.example, subject: ci}], trusted_root: sigstore-public-good}\n"
)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["admission", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_check_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "policy.yaml"
    good.write_text("images: [registry.example.com/kb/**]\n" + TRUST)
    rc, out, _ = run(capsys, "check-policy", str(good))
    assert rc == 0 and "ok: enforce mode" in out and "trusts identity ci from https://ci.example" in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("images: [r.io/**]\n" + TRUST + "cache: {ttl: 3}\n", "policy.yaml:3: cache.ttl: unknown key"),
        ("images: [r.io/**]\nverify: {keys: [missing.pub]}\n", "policy.yaml:2: verify.keys[0]:"),
        (
            "images: [r.io/**]\nverify: {identities: [{issuer: x}]}\n",
            "policy.yaml:2: verify.identities[0]: give exactly one of subject",
        ),
        (
            "images: [r.io/**]\nverify: {keyz: []}\n",
            "policy.yaml:2: verify.keyz: unknown key; did you mean 'keys'?",
        ),
    ],
)
def test_bad_policies_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    serve = ("--policy", str(policy), "--tls-cert", str(policy), "--tls-key", str(policy))
    for args in (("check-policy", str(policy)), serve):
        rc, _, err = run(capsys, *args)
        assert rc == 2
        assert err.count("\n") == 1 and expected in err.replace(str(tmp_path) + "/", ""), err


def test_serving_needs_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys)
    assert rc == 2 and "--policy, --tls-cert, --tls-key required" in err


def test_review_of_a_file_that_is_not_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("images: [r.io/**]\n" + TRUST)
    request = tmp_path / "request.json"
    request.write_text("apiVersion: admission.k8s.io/v1\n")
    rc, _, err = run(capsys, "review", "--policy", str(policy), str(request))
    assert rc == 2 and "request.json: not JSON" in err
    rc, _, err = run(capsys, "review", "--policy", str(policy), str(tmp_path / "absent.json"))
    assert rc == 2 and "cannot read" in err


def test_the_readmes_local_example_policy_and_review_load_as_shipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """deploy/examples (the README's "Run it"): the policy trusts the key `make image` makes, and
    the review is a Pod that `make admission-try` fills in."""
    import json
    import shutil

    from kernelbake.signing.keys import generate_key_pair
    from tests.conftest import REPO

    examples = tmp_path / "deploy" / "examples"
    shutil.copytree(REPO / "deploy" / "examples", examples)
    generate_key_pair(tmp_path / "build" / "signing", name="kernelbake")
    policy = examples / "local-policy.yaml"
    rc, out, _ = run(capsys, "check-policy", str(policy))
    assert rc == 0 and "governs 127.0.0.1:*/**" in out
    review = json.loads((examples / "local-pod.json").read_text())
    assert review["request"]["object"]["spec"]["containers"][0]["image"] == "IMAGE"
    # Outside the governed repositories it is admitted untouched: the request itself is sound.
    request = tmp_path / "review.json"
    request.write_text(json.dumps(review).replace('"IMAGE"', '"registry.example.com/other/app:1"'))
    rc, out, _ = run(capsys, "review", "--policy", str(policy), str(request))
    assert rc == 0 and json.loads(out)["response"]["allowed"] is True
