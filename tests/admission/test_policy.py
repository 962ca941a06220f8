from __future__ import annotations

from pathlib import Path

import pytest

from kernelbake.admission.policy import (
    GpuMatch,
    Mode,
    OnRegistryError,
    PolicyError,
    UnlistedRegistries,
    load_admission_policy,
)
from kernelbake.errors import BadInput

GOOD = """\
mode: warn
images:
  - registry.example.com/kernelbake/**
  - ubuntu
verify:
  identities:
    - issuer: https://token.actions.githubusercontent.com
      subject: ci@example.com
gpu:
  match: arch
registry_errors: unsafe-allow
deadline_seconds: 5
cache:
  ttl_seconds: 60
  tag_ttl_seconds: 0
concurrency: 4
"""


def test_a_full_policy_loads(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD)
    policy = load_admission_policy(path)
    assert policy.mode is Mode.WARN
    assert policy.gpu_match is GpuMatch.ARCH
    assert policy.registry_errors is OnRegistryError.UNSAFE_ALLOW
    assert policy.images == ("registry.example.com/kernelbake/**", "docker.io/library/ubuntu")
    assert policy.cache.tag_ttl_seconds == 0 and policy.cache.ttl_seconds == 60
    assert policy.deadline_seconds == 5 and policy.concurrency == 4
    assert policy.governs("registry.example.com/kernelbake/qwen3")
    assert policy.governs("docker.io/library/ubuntu")
    assert not policy.governs("registry.example.com/other/qwen3")


def test_defaults_fail_closed(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("images: [r.example.com/**]\nverify: {keys: [k.pem]}\n")
    policy = load_admission_policy(path)
    assert policy.mode is Mode.ENFORCE
    assert policy.registry_errors is OnRegistryError.DENY
    assert policy.gpu_match is GpuMatch.DEVICE
    assert policy.deadline_seconds < 10
    # One registry gets half the verification threads, so a flooded one leaves the rest.
    assert (policy.concurrency, policy.registry_concurrency, policy.registry_queue) == (8, 4, 64)


def test_verification_capacity_per_registry(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("images: [r.example.com/**]\nverify: {keys: [k.pem]}\nconcurrency: 3\n")
    assert load_admission_policy(path).registry_concurrency == 1
    path.write_text(
        "images: [r.example.com/**]\nverify: {keys: [k.pem]}\n"
        "concurrency: 6\nregistry_concurrency: 6\nregistry_queue: 0\n"
    )
    policy = load_admission_policy(path)
    assert (policy.registry_concurrency, policy.registry_queue) == (6, 0)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("- a\n", "p.yaml:1: expected a mapping, got list"),
        (
            "images: [a/**]\nverify: {k: 1}\nmodes: warn\n",
            "p.yaml:3: modes: unknown key; did you mean 'mode'?",
        ),
        ("verify: {k: 1}\n", "p.yaml:1: images: required"),
        ("images: []\nverify: {k: 1}\n", "p.yaml:1: images: required"),
        ("images: [3]\nverify: {k: 1}\n", "p.yaml:1: images[0]: expected a repository pattern"),
        (
            "images: ['r.io/kb/x:tag']\nverify: {k: 1}\n",
            "p.yaml:1: images[0]: 'r.io/kb/x:tag' names a tag or digest",
        ),
        ("images: [a/**]\n", "p.yaml:1: verify: required"),
        ("images: [a/**]\nverify: {}\n", "p.yaml:2: verify: required"),
        (
            "images: [a/**]\nverify: {k: 1}\nmode: audit\n",
            "p.yaml:3: mode: unknown value 'audit'; expected one of: enforce, warn",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\ngpu: {match: name}\n",
            "p.yaml:3: gpu.match: unknown value 'name'; expected one of: arch, device",
        ),
        ("images: [a/**]\nverify: {k: 1}\ngpu: {mtch: arch}\n", "p.yaml:3: gpu.mtch: unknown key"),
        (
            "images: [a/**]\nverify: {k: 1}\nregistry_errors: allow\n",
            "p.yaml:3: registry_errors: unknown value 'allow'; expected one of: deny, unsafe-allow",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\ndeadline_seconds: 45\n",
            "p.yaml:3: deadline_seconds: 45.0 must be above 0",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\ndeadline_seconds: soon\n",
            "p.yaml:3: deadline_seconds: expected a non-negative",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\ncache: {ttl_seconds: -1}\n",
            "p.yaml:3: cache.ttl_seconds: expected a non-negative",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\ncache: {max_entries: 0}\n",
            "p.yaml:3: cache.max_entries: expected a positive integer",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\nconcurrency: true\n",
            "p.yaml:3: concurrency: expected a positive integer",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\nconcurrency: 4\nregistry_concurrency: 5\n",
            "p.yaml:4: registry_concurrency: 5 is more than concurrency (4)",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\nregistry_concurrency: 0\n",
            "p.yaml:3: registry_concurrency: expected a positive integer, got 0",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\nregistry_queue: -1\n",
            "p.yaml:3: registry_queue: expected an integer >= 0, got -1",
        ),
        ("images: [a/**\nverify: x\n", "p.yaml:2: malformed YAML: "),
        (
            "images: [a/**]\nverify: {k: 1}\nunlisted_registries: block\n",
            "p.yaml:3: unlisted_registries: unknown value 'block'; expected one of: allow, deny",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\nunverified_registries: [docker.io]\n",
            "p.yaml:3: unverified_registries: is read only with unlisted_registries: deny",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\nunlisted_registries: deny\nunverified_registries: docker.io\n",
            "p.yaml:4: unverified_registries: expected a list, got str",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\nunlisted_registries: deny\nunverified_registries: [docker.io/prom]\n",
            "p.yaml:4: unverified_registries[0]: 'docker.io/prom' is not a registry host[:port]",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\nunlisted_registries: deny\nunverified_registries:\n  - quay.io\n  - vm\n",
            "p.yaml:6: unverified_registries[1]: registry host 'vm': a one-label host without a port",
        ),
        (
            "images: [a/**]\nverify: {k: 1}\nunlisted_registries: deny\nunverified_registries: ['r.io:99999']\n",
            "p.yaml:4: unverified_registries[0]: registry host 'r.io:99999': port",
        ),
    ],
)
def test_bad_policies_name_file_and_field(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError) as err:
        load_admission_policy(path)
    message = str(err.value).replace(str(tmp_path) + "/", "")
    assert message.startswith(where), message
    assert "\n" not in message
    assert isinstance(err.value, BadInput) and err.value.return_code == 2


def test_unlisted_registries_allow_by_default_and_deny_lists_the_policys_hosts(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("images: [r.example.com/kb/**, 'LOCALHOST:05101/kb/**']\nverify: {keys: [k.pem]}\n")
    policy = load_admission_policy(path)
    assert policy.unlisted_registries is UnlistedRegistries.ALLOW
    assert policy.listed_registries() is None
    path.write_text(
        "images: [r.example.com/kb/**, 'LOCALHOST:05101/kb/**', r.example.com/other/**]\n"
        "verify: {keys: [k.pem]}\n"
        "unlisted_registries: deny\n"
        "unverified_registries: [index.docker.io, Quay.IO, '*.mirror.example.com:5000', '[::1]:5000']\n"
    )
    policy = load_admission_policy(path)
    assert policy.unlisted_registries is UnlistedRegistries.DENY
    assert policy.listed_registries() == (
        "r.example.com",
        "localhost:5101",
        "docker.io",
        "quay.io",
        "*.mirror.example.com:5000",
        "[::1]:5000",
    )
    path.write_text("images: [r.example.com/kb/**]\nverify: {keys: [k.pem]}\nunlisted_registries: deny\n")
    assert load_admission_policy(path).listed_registries() == ("r.example.com",)


def test_a_missing_policy_file_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_admission_policy(tmp_path / "nope.yaml")
