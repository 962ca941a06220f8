"""Every way verification (or keyless signing) must fail: through the CLI, each gives one line
on stderr, its own exit code, no traceback, and never "verified"."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelbake import oci
from kernelbake.cli import main
from kernelbake.contract.key import LABEL_DIGEST, LABEL_KEY
from kernelbake.errors import BadInput, KernelbakeError
from kernelbake.labels import derived_labels
from kernelbake.oci import RegistryClient
from kernelbake.signing import errors as E
from kernelbake.signing.predicate import PREDICATE_TYPE
from kernelbake.signing.sign import sign_image
from tests.signing.conftest import ISSUER, SUBJECT, ImageFactory, KeyPair, MockSigstore, make_token
from tests.signing.images import PushedImage, push_image, tiny_llama_target
from tests.signing.tamper import copy_signatures, replace_bundles, rewrite_bundles
from tests.support.attacks import attach_statement
from tests.support.faults import fault_proxy, silent_registry


# The CLI's failure modes are signing logic: the in-memory registry serves them (no binary).
@pytest.fixture(scope="session")
def image_registry(memory_registry: str) -> str:
    return memory_registry


SEEN: dict[int, str] = {}


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    for name in ("KERNELBAKE_OIDC_TOKEN", "SIGSTORE_ID_TOKEN", "KERNELBAKE_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)


def rejected(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: type[KernelbakeError], match: str = ""
) -> str:
    """Run the CLI; assert the exit code of ``expected``, one line on stderr, no "verified"."""
    rc = main(argv)
    out, err = capsys.readouterr()
    code = expected.return_code
    assert rc == code, f"exit {rc}, expected {code} ({expected.__name__}); stderr: {err}"
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert lines[0].startswith(f"kernelbake {argv[0]}: error: ")
    assert "Traceback" not in out + err
    assert "verified" not in out.lower()
    assert match in lines[0], f"{match!r} not in {lines[0]!r}"
    SEEN.setdefault(rc, expected.__name__)
    assert SEEN[rc] == expected.__name__, f"exit code {rc} used by {SEEN[rc]} and {expected.__name__}"
    return lines[0]


def verify_argv(image: str, keys: KeyPair, *extra: str) -> list[str]:
    return ["verify", image, "--key", str(keys.public_path), *extra]


def test_unsigned(make_image: ImageFactory, keys: KeyPair, capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    rejected(capsys, verify_argv(image.tagged, keys), E.Unsigned, "no signature found")


def test_wrong_key(
    make_image: ImageFactory,
    client: RegistryClient,
    keys: KeyPair,
    other_keys: KeyPair,
    capsys: pytest.CaptureFixture[str],
) -> None:
    image = make_image()
    sign_image(image.tagged, other_keys.signer, client=client, legacy=True)
    rejected(capsys, verify_argv(image.tagged, keys), E.UntrustedSigner, other_keys.public.fingerprint)


@pytest.mark.sigstore
def test_wrong_identity(
    make_image: ImageFactory,
    client: RegistryClient,
    sigstore_mock: MockSigstore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kernelbake.signing._internal.keyless import load_trust_config
    from kernelbake.signing.signer import KeylessSigner

    image = make_image()
    token = make_token(
        subject="https://ci.kernelbake.test/mallory/fork/.github/workflows/x.yml@refs/heads/evil"
    )
    sign_image(
        image.tagged, KeylessSigner(load_trust_config(str(sigstore_mock.trust_config)), token), client=client
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        json.dumps(
            {
                "verify": {
                    "identities": [{"issuer": ISSUER, "subject": SUBJECT}],
                    "trusted_root": str(sigstore_mock.trusted_root),
                }
            }
        )
    )
    rejected(capsys, ["verify", image.tagged, "--policy", str(policy)], E.UntrustedSigner, "mallory")


def test_signature_for_another_digest(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    signed = make_image(tag="signed")
    other = make_image(tag="other", repo=signed.ref.repository)
    sign_image(signed.tagged, keys.signer, client=client, legacy=True)
    copy_signatures(client, signed, other)
    rejected(capsys, verify_argv(other.tagged, keys), E.SubjectMismatch, f"made for {signed.digest}")


def test_tag_moved_after_signing(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    signed = make_image(tag="prod")
    sign_image(signed.tagged, keys.signer, client=client)
    moved = make_image(tag="prod", repo=signed.ref.repository)  # re-points :prod
    assert moved.digest != signed.digest
    rejected(capsys, verify_argv(f"{signed.tagged}@{signed.digest}", keys), E.TagMoved, moved.digest)
    # Given the tag alone, the verifier checks what the tag names now: not signed.
    rejected(capsys, verify_argv(signed.tagged, keys), E.Unsigned, moved.digest)


def _edited(labels: dict[str, str], **fields: str) -> dict[str, str]:
    out = dict(labels)
    for name, value in fields.items():
        out[f"dev.kernelbake.{name.replace('_', '-')}"] = value
    return out


def test_label_edited_after_signing(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    original = make_image(tag="v1")
    signed = sign_image(original.tagged, keys.signer, client=client)
    assert signed.predicate is not None
    repo = original.ref.repository

    # One label edited: the image's own labels now disagree with each other. Even a pipeline that
    # re-signs and re-attests whatever lands in the registry cannot make that verify.
    one = make_image(tag="v1", repo=repo, labels=_edited(dict(original.labels), device="NVIDIA H100 PCIe"))
    rejected(capsys, verify_argv(original.tagged, keys), E.Unsigned)  # the edit is a new, unsigned digest
    with pytest.raises(BadInput, match="device"):
        sign_image(one.tagged, keys.signer, client=client)  # kernelbake refuses to attest it
    sign_image(one.tagged, keys.signer, client=client, attest=False)
    attach_statement(one.tagged, keys.signer, PREDICATE_TYPE, signed.predicate.to_json(), client=client)
    rejected(capsys, verify_argv(one.tagged, keys), E.LabelMismatch, "device")

    # All key labels edited consistently (the GPU labels derived from them too): they now disagree
    # with the attested key.
    forged_key = original.key.replace(device="NVIDIA H100 PCIe")
    relabelled = {**dict(original.labels), **derived_labels(forged_key)}
    assert relabelled[LABEL_KEY] != original.labels[LABEL_KEY] and LABEL_DIGEST in relabelled
    two = make_image(tag="v1", repo=repo, labels=relabelled)
    sign_image(two.tagged, keys.signer, client=client, attest=False)
    attach_statement(two.tagged, keys.signer, PREDICATE_TYPE, signed.predicate.to_json(), client=client)
    rejected(capsys, verify_argv(two.tagged, keys), E.LabelMismatch, "fields differ: device")


def test_bundle_corrupted(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = make_image()
    sign_image(garbage.tagged, keys.signer, client=client)
    replace_bundles(client, garbage, b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json", "verif')
    rejected(capsys, verify_argv(garbage.tagged, keys), E.MalformedSignature, "not JSON")

    flipped = make_image()
    sign_image(flipped.tagged, keys.signer, client=client)

    def flip(bundle: dict[str, Any]) -> dict[str, Any]:
        sig = bytearray(base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"]))
        sig[-2] ^= 0x40
        bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
        return bundle

    rewrite_bundles(client, flipped, flip)
    rejected(capsys, verify_argv(flipped.tagged, keys), E.InvalidSignature, "does not verify")

    payload_edit = make_image()
    sign_image(payload_edit.tagged, keys.signer, client=client)

    def retarget(bundle: dict[str, Any]) -> dict[str, Any]:
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        statement["predicate"] = {"sneaky": True}
        bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
        return bundle

    rewrite_bundles(client, payload_edit, retarget)
    rejected(capsys, verify_argv(payload_edit.tagged, keys), E.InvalidSignature, "does not verify")


def test_missing_attestation(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client, attest=False)
    rejected(capsys, verify_argv(image.tagged, keys), E.MissingAttestation, "kernelbake attestation")


def test_cache_manifest_not_the_attested_one(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    image = make_image()
    signed = sign_image(image.tagged, keys.signer, client=client, attest=False)
    assert signed.predicate is None
    honest = make_image()
    predicate = sign_image(honest.tagged, keys.signer, client=client).predicate
    assert predicate is not None
    # An attestation for this digest that describes another build's cache manifest.
    wrong = dataclasses.replace(predicate, cache_layer_digest=_last_layer(client, image))
    attach_statement(image.tagged, keys.signer, PREDICATE_TYPE, wrong.to_json(), client=client)
    rejected(capsys, verify_argv(image.tagged, keys), E.CacheManifestMismatch, "the attestation says")

    extra = make_image(last_layer_extra={"opt/kernelbake/cache/inductor/smuggled.so": b"\x7fELF"})
    with pytest.raises(BadInput, match="must hold only"):
        sign_image(extra.tagged, keys.signer, client=client)
    sign_image(extra.tagged, keys.signer, client=client, attest=False)
    smuggled = dataclasses.replace(predicate, cache_layer_digest=_last_layer(client, extra))
    attach_statement(extra.tagged, keys.signer, PREDICATE_TYPE, smuggled.to_json(), client=client)
    rejected(capsys, verify_argv(extra.tagged, keys), E.CacheManifestMismatch, "smuggled.so")


def _last_layer(client: RegistryClient, image: PushedImage) -> str:
    return client.get_manifest(image.ref.with_digest(image.digest)).layers[-1].digest


def test_not_a_kernelbake_image(
    make_image: ImageFactory, client: RegistryClient, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    image = make_image(labels={"org.opencontainers.image.title": "someone else's"})
    sign_image(image.tagged, keys.signer, client=client, attest=False)
    rejected(capsys, verify_argv(image.tagged, keys), E.NotKernelbakeImage, "not a kernelbake image")


def test_registry_404(image_registry: str, keys: KeyPair, capsys: pytest.CaptureFixture[str]) -> None:
    rejected(
        capsys, verify_argv(f"{image_registry}/kb/does-not-exist:v1", keys), E.ImageNotFound, "not found"
    )


def test_registry_500(
    image_registry: str,
    client: RegistryClient,
    make_image: ImageFactory,
    keys: KeyPair,
    capsys: pytest.CaptureFixture[str],
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    repo = image.ref.repository
    with fault_proxy(image_registry, lambda method, path: 500) as broken:
        rejected(capsys, verify_argv(f"{broken}/{repo}:v1", keys), E.RegistryServerFailure, "500")
    # Failing only where signatures are looked up must not read as "unsigned".
    with fault_proxy(
        image_registry, lambda method, path: 500 if "/manifests/sha256-" in path else None
    ) as flaky:
        rejected(capsys, verify_argv(f"{flaky}/{repo}:v1", keys), E.RegistryServerFailure, "500")


def test_registry_timeout(keys: KeyPair, capsys: pytest.CaptureFixture[str]) -> None:
    with silent_registry() as silent:
        rejected(
            capsys,
            verify_argv(f"{silent}/kb/tiny:v1", keys, "--timeout", "0.5"),
            E.RegistryTimeout,
            "did not finish within 0.5s",
        )


def test_registry_refused_connection(keys: KeyPair, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.registry import free_port

    rejected(
        capsys, verify_argv(f"127.0.0.1:{free_port()}/kb/tiny:v1", keys), E.RegistryTimeout, "cannot connect"
    )


@pytest.fixture
def keyless_env(monkeypatch: pytest.MonkeyPatch, sigstore_mock: MockSigstore) -> Iterator[None]:
    monkeypatch.setenv("KERNELBAKE_TRUST_CONFIG", str(sigstore_mock.trust_config))
    yield


@pytest.mark.sigstore
def test_expired_token(
    make_image: ImageFactory,
    keyless_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    image = make_image()
    monkeypatch.setenv("KERNELBAKE_OIDC_TOKEN", make_token(age=3600, lifetime=600))
    rejected(capsys, ["sign", "--keyless", image.tagged], E.TokenExpired, "expired")


@pytest.mark.sigstore
@pytest.mark.parametrize(
    ("token", "match"),
    [
        ("not-a-jwt", "not a JWT"),
        ("eyJhbGciOiJub25lIn0.!!!.sig", "base64url"),
        (make_token(aud="someone-else"), "audience"),
        (
            make_token().split(".")[0] + "." + base64.urlsafe_b64encode(b'{"sub":"x"}').decode() + ".s",
            "lacks claims",
        ),
    ],
)
def test_malformed_token(
    make_image: ImageFactory,
    keyless_env: None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    token: str,
    match: str,
) -> None:
    image = make_image()
    monkeypatch.setenv("KERNELBAKE_OIDC_TOKEN", token)
    rejected(capsys, ["sign", "--keyless", image.tagged], E.TokenMalformed, match)


@pytest.mark.sigstore
def test_no_token(make_image: ImageFactory, keyless_env: None, capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    rejected(capsys, ["sign", "--keyless", image.tagged], E.TokenMissing, "OIDC identity token")


def test_bad_reference_and_policy_are_bad_input(
    image_registry: str, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rejected(
        capsys, verify_argv(f"{image_registry}/Kb/UPPER:v1", keys), E.InvalidImageReference, "bad repository"
    )
    assert issubclass(E.InvalidImageReference, BadInput)
    assert issubclass(E.InvalidImageReference, E.VerificationFailed)
    empty = tmp_path / "empty.yaml"
    empty.write_text("verify:\n  keys: []\n")
    rejected(
        capsys,
        ["verify", f"{image_registry}/kb/x:v1", "--policy", str(empty)],
        BadInput,
        "trusts no identity",
    )


def test_every_failure_class_has_its_own_exit_code() -> None:
    from kernelbake import errors

    classes = [
        errors.BadInput,
        errors.EnvironmentProblem,
        errors.BuildFailed,
        errors.RegistryError,
        errors.KeyMismatch,
    ]
    classes += [
        c
        for c in vars(E).values()
        if isinstance(c, type) and issubclass(c, errors.KernelbakeError) and c.__module__ == E.__name__
    ]
    codes = [c.return_code for c in classes]
    assert len(codes) == len(set(codes)), sorted(zip(codes, [c.__name__ for c in classes], strict=True))
    assert all(0 < c < 126 for c in codes)
    # One "could not answer" type, oci's, whichever layer raised it.
    assert all(
        issubclass(c, oci.RegistryUnavailable)
        for c in (E.RegistryServerFailure, E.RegistryTimeout, E.RegistryAccessDenied)
    )
    assert issubclass(E.ImageNotFound, oci.RegistryNotFound)
    assert not issubclass(E.ImageNotFound, oci.RegistryUnavailable)
    assert not issubclass(E.RegistryMisbehaved, oci.RegistryUnavailable)


def test_push_helper_builds_labels_from_plan() -> None:
    # Guard for the fixtures above: test images carry exactly plan()'s labels.
    target = tiny_llama_target()
    assert dict(target.labels)[LABEL_KEY] == str(target.key)
    assert push_image is not None


@pytest.mark.sigstore
def test_signing_service_down(
    make_image: ImageFactory,
    sigstore_mock: MockSigstore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.support.registry import free_port

    config = json.loads(sigstore_mock.trust_config.read_text())
    dead = f"http://127.0.0.1:{free_port()}"
    for name in ("caUrls", "rekorTlogUrls"):
        config["signingConfig"][name][0]["url"] = dead
    trust_config = tmp_path / "trust_config.json"
    trust_config.write_text(json.dumps(config))
    image = make_image()
    monkeypatch.setenv("KERNELBAKE_OIDC_TOKEN", make_token())
    rejected(
        capsys,
        ["sign", "--keyless", "--trust-config", str(trust_config), image.tagged],
        E.SigningServiceError,
        "unreachable",
    )
