"""Bad input: one line naming the file/field, exit code 2, no traceback, nothing built."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelbake import textfile
from kernelbake.admission.http.server import MAX_BODY
from kernelbake.cli import main
from kernelbake.errors import BadInput
from tests.conftest import REPO

SPECS = REPO / "tests" / "specs"

CASES = [
    ("malformed.yaml", "malformed YAML", ":3"),
    ("unknown-gpu.yaml", "unknown GPU 'h1000'", "did you mean 'h100'"),
    ("unknown-engine.yaml", "engine.name: unknown value 'vlm'", "did you mean 'vllm'"),
    (
        "unknown-engine-version.yaml",
        "torch '2.13.1' is not a supported release",
        "supported: 2.13.0 (cpu: cpu)",
    ),
    ("bad-revision.yaml", "model.revision: must be a pinned 40-hex commit", "'main'"),
    ("missing-field.yaml", "missing required key engine", "missing-field.yaml"),
    ("unknown-key.yaml", "serve.max_model_length: unknown key", "did you mean 'max_model_len'"),
    ("wrong-target.yaml", "torch 2.13.0 has no cuda build", "wrong-target.yaml"),
    ("bad-snapshot.yaml", "bad-snapshot.yaml:5: snapshot: expected true or false, got 'yes'", ""),
]


@pytest.mark.parametrize("command", ["plan", "key", "render", "build"])
@pytest.mark.parametrize(("spec", "message", "detail"), CASES)
def test_bad_spec_is_one_line_exit_2(
    command: str,
    spec: str,
    message: str,
    detail: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A docker that cannot run proves that bad input stops before Docker is touched.
    monkeypatch.setenv("KERNELBAKE_DOCKER", str(tmp_path / "no-docker"))
    args = [command, str(SPECS / spec)]
    if command in ("render", "build"):
        args += ["--out", str(tmp_path / "out")]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"kernelbake {command}: error: ")
    assert message in lines[0] and detail in lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_missing_spec_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(SPECS / "nope.yaml")]) == 2
    assert "cannot read spec" in capsys.readouterr().err


def test_unknown_gpu_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["key", str(REPO / "images" / "qwen3-8b.yaml"), "--gpu", "h10"]) == 2
    assert "--gpu: unknown GPU 'h10'; did you mean 'h100'?" in capsys.readouterr().err


def test_gpu_not_in_targets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(REPO / "images" / "gpt-oss-20b.yaml"), "--gpu", "l4"]) == 2
    assert "is not a target of this spec" in capsys.readouterr().err


def test_docker_missing_is_environment_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KERNELBAKE_DOCKER", str(tmp_path / "no-docker"))
    rc = main(["build", str(REPO / "images" / "tiny-llama-torch.yaml"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3
    assert err[-1].startswith("kernelbake build: error: ") and "command not found" in err[-1]


def test_daemon_down_is_environment_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///x.sock' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KERNELBAKE_DOCKER", str(fake))
    rc = main(["build", str(REPO / "images" / "tiny-llama-torch.yaml"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3
    assert "Docker daemon is not reachable (Cannot connect to the Docker daemon" in err[-1]


def test_registry_unreachable_stops_before_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.registry import free_port

    fake = tmp_path / "docker"
    calls = tmp_path / "calls"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho 26.1.5\n')
    fake.chmod(0o755)
    monkeypatch.setenv("KERNELBAKE_DOCKER", str(fake))
    port = free_port()
    rc = main(
        [
            "build",
            str(REPO / "images" / "tiny-llama-torch.yaml"),
            "--push",
            f"127.0.0.1:{port}/kb",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3
    assert f"registry 127.0.0.1:{port} is unreachable" in err[-1]
    # Docker was asked only what is there (the family's builder, images), nothing was built or pushed.
    commands = [line.split() for line in calls.read_text().splitlines()]
    assert not [c for c in commands if "bake" in c or "build" in c or "push" in c or "run" in c]


@pytest.mark.parametrize("command", ["render", "build"])
def test_build_mode_is_shown_and_taken_as_its_wire_value(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "--mode {single,two-phase}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([command, "--mode", "twophase", str(SPECS / "malformed.yaml")])
    assert exc.value.code == 2


def test_plan_errors_name_the_line_too(capsys: pytest.CaptureFixture[str]) -> None:
    # Found by plan (the catalogue), after loading: still file:line: field.
    assert main(["plan", str(SPECS / "unknown-gpu.yaml")]) == 2
    assert "unknown-gpu.yaml:4: targets[0]: unknown GPU 'h1000'" in capsys.readouterr().err
    assert main(["plan", str(SPECS / "unknown-engine-version.yaml")]) == 2
    assert (
        "unknown-engine-version.yaml:3: engine.version: torch '2.13.1' is not a supported"
        in capsys.readouterr().err
    )


# -- files that are not text, not files, or empty --------------------------------------------

# name → (how to make it, what the one line says about it)
BAD_FILES = {
    "latin-1": (lambda p: p.write_bytes("name: caf\xe9\n".encode("latin-1")), "(byte 0xe9 at offset 9)"),
    "png": (lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), "(byte 0x89 at offset 0)"),
    "directory": (lambda p: p.mkdir(), "a directory, not a regular file"),
    "under-a-file": (lambda p: None, "Not a directory"),
    "empty": (lambda p: p.write_bytes(b""), ""),
    "nul-byte": (lambda p: p.write_bytes(b"name: x\x00y\n"), "is not text (a NUL byte at offset 7)"),
    # Each command says what the nesting is to it (YAML: too deep; JSON: not JSON; a token: not
    # one); what matters here is one line, exit 2, no RecursionError.
    "nested-100000-deep": (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), ""),
    "over-the-size-limit": (
        lambda p: p.write_bytes(b"#" * (textfile.MAX_INPUT_BYTES + 1)),
        f"over the {textfile.MAX_INPUT_BYTES}-byte limit",
    ),
    # Opened without waiting for a writer, and refused: a plain open() would hang here.
    "fifo": (lambda p: os.mkfifo(p), "a FIFO, not a regular file"),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "a character device, not a regular file"),
}
_DIGEST = "sha256:" + "0" * 64
_NOWHERE = f"127.0.0.1:1/kb/x@{_DIGEST}"
_TRUST = "identities: [{issuer: https://ci.example, subject: ci}]\ntrusted_root: sigstore-public-good\n"
_REQUEST = json.dumps(
    {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE"},
    }
)


def _good(tmp_path: Path) -> dict[str, str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "images: [r.example/**]\nverify:\n" + "".join(f"  {line}\n" for line in _TRUST.splitlines())
    )
    request = tmp_path / "request.json"
    request.write_text(_REQUEST)
    return {"policy": str(policy), "request": str(request)}


# command → argv around the bad file ``F`` (and good files where the command needs them)
FILE_COMMANDS: dict[str, Callable[[str, dict[str, str]], list[str]]] = {
    "plan": lambda f, g: ["plan", f],
    "key": lambda f, g: ["key", f],
    "render": lambda f, g: ["render", f, "--out", f + ".out"],
    "build": lambda f, g: ["build", f, "--out", f + ".out"],
    "verify --policy": lambda f, g: ["verify", _NOWHERE, "--policy", f, "--timeout", "1"],
    "sign --identity-token-file": lambda f, g: ["sign", _NOWHERE, "--keyless", "--identity-token-file", f],
    "admission check-policy": lambda f, g: ["admission", "check-policy", f],
    "admission review --policy": lambda f, g: ["admission", "review", "--policy", f, g["request"]],
    "admission review REQUEST": lambda f, g: ["admission", "review", "--policy", g["policy"], f],
    "admission --policy": lambda f, g: ["admission", "--policy", f, "--tls-cert", f, "--tls-key", f],
    "admission --tls-cert": lambda f, g: [
        "admission",
        "--policy",
        g["policy"],
        "--tls-cert",
        f,
        "--tls-key",
        f,
    ],
}


# A token is one line of text, not a structure: nesting means nothing to it (it is refused as no
# JWT, by the signing stack's own exit code).
_NOT_STRUCTURED = {("sign --identity-token-file", "nested-100000-deep")}


@pytest.mark.parametrize(
    ("command", "bad"),
    [(c, b) for c in FILE_COMMANDS for b in BAD_FILES if (c, b) not in _NOT_STRUCTURED],
)
def test_a_bad_file_is_one_line_naming_it_exit_2(
    command: str,
    bad: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KERNELBAKE_DOCKER", str(tmp_path / "no-docker"))
    make, detail = BAD_FILES[bad]
    if bad == "over-the-size-limit" and command == "admission review REQUEST":
        # A request is read up to the webhook's own body limit; a YAML file's limit is far lower.
        make = lambda p: p.write_bytes(b" " * (MAX_BODY + 1))  # noqa: E731
        detail = f"over the {MAX_BODY}-byte limit"
    # PEM files are read by OpenSSL, which says what it found, not where.
    pem = command == "admission --tls-cert" and bad in (
        "latin-1",
        "png",
        "empty",
        "nul-byte",
        "nested-100000-deep",
    )
    if pem:
        detail = "not a PEM certificate and its private key"
    path = tmp_path / "a-file" / "input.yaml" if bad == "under-a-file" else tmp_path / "input.yaml"
    if bad == "under-a-file":
        (tmp_path / "a-file").write_text("x")
    make(path)
    argv = FILE_COMMANDS[command](str(path), _good(tmp_path))
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"kernelbake {argv[0]}: error: ")
    assert str(path) in lines[0] and detail in lines[0]
    if bad in ("latin-1", "png") and not pem:
        assert "is not UTF-8 text" in lines[0]


def test_an_empty_spec_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "empty.yaml"
    spec.write_text("\n")
    assert main(["plan", str(spec)]) == 2
    assert f"{spec}: the spec is empty" in capsys.readouterr().err


def test_an_image_target_or_manifest_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    from kernelbake.contract.target import TargetConfig
    from kernelbake.runtime.bundle import read_manifest

    (tmp_path / "manifest.json").write_bytes(b"\x89PNG\r\n")
    with pytest.raises(BadInput, match=r"manifest.json: not a cache manifest \(byte 0 is not UTF-8\)"):
        read_manifest(tmp_path)
    (tmp_path / "target.json").write_bytes(b"{\xff}")
    with pytest.raises(BadInput, match=r"target.json: not a kernelbake target file \(byte 1 is not UTF-8\)"):
        TargetConfig.load(tmp_path / "target.json")


TINY = (REPO / "images" / "tiny-llama.yaml").read_text()


@pytest.mark.parametrize(
    ("argv", "text", "expected"),
    [
        # Every YAML file a user gives kernelbake: a spec, a verify policy, an admission policy.
        (
            ["plan"],
            TINY.replace("  dtype: float32\n", "  dtype: float32\n  max_num_seqs: 4\n"),
            ("serve.max_num_seqs", "max_num_seqs", 16, 13),
        ),
        (
            ["verify", "--policy"],
            "keys: [a.pub]\nrequire_attestation: true\nkeys: [b.pub]\n",
            ("keys", "keys", 3, 1),
        ),
        (
            ["admission", "check-policy"],
            "images: [r.io/**]\nverify:\n  keys: [a.pub]\n  keys: [b.pub]\n",
            ("verify.keys", "keys", 4, 3),
        ),
    ],
    ids=["spec", "verify-policy", "admission-policy"],
)
def test_a_key_given_twice_in_any_yaml_input_is_refused(
    argv: list[str],
    text: str,
    expected: tuple[str, str, int, int],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "input.yaml"
    path.write_text(text)
    field, key, again, first = expected
    extra = ["registry.example.com/kb/m@sha256:" + "a" * 64] if argv[0] == "verify" else []
    assert main([*argv, str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{path}:{again}: {field}: duplicate key {key!r}, first at {path}:{first} (keep one" in err, err
