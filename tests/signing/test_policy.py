"""The verify policy validates itself: fail closed, name source:field, suggest the right field."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbake.errors import BadInput
from kernelbake.signing.policy import PUBLIC_GOOD, IdentityRule, VerifyPolicy, load_policy
from tests.signing.conftest import KeyPair

SRC = "admission.yaml: verify"


def test_empty_trust_fails_closed() -> None:
    cases: list[dict[str, object]] = [
        {},
        {"keys": []},
        {"identities": [], "keys": []},
        {"require_attestation": False},
    ]
    for data in cases:
        with pytest.raises(BadInput, match="trusts no identity and no key"):
            VerifyPolicy.from_mapping(data, source=SRC)
    with pytest.raises(BadInput, match="trusts no identity"):
        VerifyPolicy()


def test_unknown_fields_are_named_with_a_suggestion(keys: KeyPair) -> None:
    with pytest.raises(
        BadInput, match=r"admission.yaml: verify: trusted_roots: unknown key; did you mean 'trusted_root'"
    ):
        VerifyPolicy.from_mapping({"keys": [str(keys.public_path)], "trusted_roots": "x"}, source=SRC)
    with pytest.raises(BadInput, match=r"identities\[0\]\.subjct: unknown key; did you mean 'subject'"):
        VerifyPolicy.from_mapping({"identities": [{"issuer": "i", "subjct": "s"}]}, source=SRC)


def test_keys_by_path_inline_and_mapping(keys: KeyPair, tmp_path: Path) -> None:
    pem = keys.public_path.read_text()
    policy = VerifyPolicy.from_mapping(
        {"keys": [keys.public_path.name, pem, {"path": str(keys.public_path)}, {"pem": pem}]},
        source=SRC,
        base_dir=keys.public_path.parent,
    )
    assert {k.fingerprint for k in policy.keys} == {keys.public.fingerprint}
    assert len(policy.keys) == 4
    with pytest.raises(BadInput, match=r"keys\[0\]: .*cannot read public key"):
        VerifyPolicy.from_mapping({"keys": ["missing.pub"]}, source=SRC, base_dir=tmp_path)
    with pytest.raises(BadInput, match=r"keys\[0\]: .*not a PEM public key"):
        VerifyPolicy.from_mapping(
            {"keys": ["-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n"]}, source=SRC
        )


def test_identity_rules() -> None:
    exact = IdentityRule(issuer="https://issuer", subject="me@example.com")
    assert exact.matches("https://issuer", ["me@example.com"])
    assert not exact.matches("https://other", ["me@example.com"])
    regex = IdentityRule(
        issuer_regex=r"https://(a|b)\.example", subject_regex=r"repo:acme/.+:ref:refs/heads/main"
    )
    assert regex.matches("https://b.example", ["x", "repo:acme/img:ref:refs/heads/main"])
    assert not regex.matches("https://b.example.evil", ["repo:acme/img:ref:refs/heads/main"])  # fullmatch
    for bad in ({"subject": "s"}, {"issuer": "i", "issuer_regex": "i", "subject": "s"}, {"issuer": "i"}):
        with pytest.raises(BadInput, match="exactly one of"):
            IdentityRule(**bad)
    with pytest.raises(BadInput, match="does not compile"):
        IdentityRule(issuer="i", subject_regex="(")


# Far more than the match needs in linear time; Python's re took 0.62 s at 25 characters and
# 4 times more per 2, so at 60 characters it would run for years.
_HANG = 60


def test_an_identity_regex_is_matched_in_linear_time_on_a_certificate_field() -> None:
    # A separate process with a timeout, so that a backtracking match fails the test instead
    # of hanging the suite.
    code = (
        "from kernelbake.signing.policy import IdentityRule\n"
        "rule = IdentityRule(issuer='https://i', subject_regex='^(a+)+$')\n"
        "print(rule.matches('https://i', ['a' * 60 + '!', 'a' * 100_000]), rule.matches('https://i', ['a' * 60 + '!']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=_HANG, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "True False\n", "")


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"^(a)\1$", r"invalid escape sequence: \\1"),
        (r"^(?=a)a$", r"invalid perl operator: \(\?="),
        (r"^(?<!b)a$", r"invalid perl operator: \(\?<"),
    ],
)
def test_a_regex_re2_cannot_match_in_linear_time_does_not_load(
    tmp_path: Path, pattern: str, why: str, capfd: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"identities:\n  - issuer: https://i\n    subject_regex: '{pattern}'\ntrusted_root: sigstore-public-good\n"
    )
    with pytest.raises(BadInput) as info:
        load_policy(policy)
    assert info.value.message.startswith(
        f"{policy}:2: identities[0]: subject_regex '{pattern.replace(chr(92), chr(92) * 2)}' does not compile as RE2: "
    )
    assert info.value.hint is not None and "cosign's --certificate-identity-regexp" in info.value.hint
    assert re.search(why, info.value.message), info.value.message
    assert capfd.readouterr().err == "", "RE2 logs nothing of its own"


def test_identities_need_a_trusted_root(tmp_path: Path) -> None:
    ident = {"issuer": "https://i", "subject": "s"}
    with pytest.raises(BadInput, match="trusted_root"):
        VerifyPolicy.from_mapping({"identities": [ident]}, source=SRC)
    bad = tmp_path / "root.json"
    bad.write_text('{"mediaType": "something else"}')
    with pytest.raises(BadInput, match="not a Sigstore trusted root"):
        VerifyPolicy.from_mapping({"identities": [ident], "trusted_root": str(bad)}, source=SRC)
    policy = VerifyPolicy.from_mapping({"identities": [ident], "trusted_root": PUBLIC_GOOD}, source=SRC)
    assert policy.trusted_root == PUBLIC_GOOD and policy.require_attestation


def test_types_are_checked(keys: KeyPair) -> None:
    with pytest.raises(BadInput, match="require_attestation"):
        VerifyPolicy.from_mapping({"keys": [str(keys.public_path)], "require_attestation": "no"}, source=SRC)
    with pytest.raises(BadInput, match="keys: expected a list"):
        VerifyPolicy.from_mapping({"keys": str(keys.public_path)}, source=SRC)
    with pytest.raises(BadInput, match="expected a mapping"):
        VerifyPolicy.from_mapping(["keys"], source=SRC)


def test_load_policy_file_with_or_without_verify_section(keys: KeyPair, tmp_path: Path) -> None:
    (tmp_path / "k.pub").write_bytes(keys.public_path.read_bytes())
    wrapped = tmp_path / "admission.yaml"
    wrapped.write_text("failurePolicy: closed\nverify:\n  keys: [k.pub]\n")
    assert load_policy(wrapped).keys[0].fingerprint == keys.public.fingerprint
    bare = tmp_path / "policy.yaml"
    bare.write_text("keys: [k.pub]\nrequire_attestation: false\n")
    assert load_policy(bare).require_attestation is False
    broken = tmp_path / "broken.yaml"
    broken.write_text("keys: [\n")
    with pytest.raises(BadInput, match=r"broken\.yaml:2: malformed YAML"):
        load_policy(broken)
    with pytest.raises(BadInput, match="cannot read policy"):
        load_policy(tmp_path / "absent.yaml")


def test_policy_file_errors_name_file_line_and_field(tmp_path: Path) -> None:
    policy = tmp_path / "admission.yaml"
    policy.write_text(
        "mode: warn\nverify:\n  identities:\n    - issuer: i\n      subject: s\n      subjct: t\n"
        "  trusted_root: sigstore-public-good\n"
    )
    with pytest.raises(BadInput, match=r"admission.yaml:6: verify.identities\[0\].subjct: unknown key"):
        load_policy(policy)
    policy.write_text("verify:\n  identities:\n    - issuer: i\n")
    with pytest.raises(
        BadInput, match=r"admission.yaml:3: verify.identities\[0\]: give exactly one of subject"
    ):
        load_policy(policy)


def test_replica_signed_deltas_are_refused_unless_the_unsafe_setting_says_otherwise(
    keys: KeyPair, tmp_path: Path
) -> None:
    (tmp_path / "k.pub").write_bytes(keys.public_path.read_bytes())
    default = tmp_path / "default.yaml"
    default.write_text("keys: [k.pub]\n")
    assert load_policy(default).unsafe_replica_deltas is False
    assert "UNSAFE" not in load_policy(default).describe()
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("verify:\n  keys: [k.pub]\n  unsafe_replica_deltas: true\n")
    assert load_policy(unsafe).unsafe_replica_deltas is True
    assert "UNSAFE: cache deltas of a replica's own bytes" in load_policy(unsafe).describe()
    with pytest.raises(BadInput, match=r"unsafe_replica_deltas: expected true or false"):
        VerifyPolicy.from_mapping(
            {"keys": [str(keys.public_path)], "unsafe_replica_deltas": "yes"}, source=SRC
        )
