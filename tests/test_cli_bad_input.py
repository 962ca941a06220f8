"""Bad input: one line naming the file/field, exit code 2, no traceback, nothing built."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbake.cli import main
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
    assert "bake" not in calls.read_text() and "push" not in calls.read_text()


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
