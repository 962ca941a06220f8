"""Inside an image kernelbake has only PyYAML and Jinja2: the CLI must load without the
host-side dependencies (requests, cryptography, sigstore), or every image's entrypoint breaks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

_BLOCK_HOST_DEPS = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"requests", "cryptography", "sigstore", "sigstore_models", "urllib3"}:
            raise ImportError(f"{name} is not in images")
sys.meta_path.insert(0, Block())
from kernelbake.cli import main
raise SystemExit(main(sys.argv[1:]))
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _BLOCK_HOST_DEPS, *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def test_runtime_commands_load_without_host_dependencies() -> None:
    for command in ("compile", "serve", "check", "seed-cache", "engine-command"):
        result = _cli(command, "--help")
        assert result.returncode == 0, result.stderr
        assert "usage:" in result.stdout


def test_host_commands_say_what_is_missing_only_when_run() -> None:
    result = _cli("plan", "images/tiny-llama-torch.yaml", "--gpu", "cpu")
    assert result.returncode == 0, result.stderr
    assert "tiny-llama-torch-cpu" in result.stdout


def test_in_image_commands_import_none_of_the_host_areas() -> None:
    """``serve`` is on every replica's start path: it parses with its own area only."""
    probe = (
        "import sys\n"
        "from kernelbake.cli import main\n"
        "try:\n"
        "    main(['serve', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "host = ('kernelbake.render', 'kernelbake.plan', 'kernelbake.cli.signing', 'jinja2', 'asyncio')\n"
        "print(sorted(m for m in host if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_the_top_level_help_still_lists_every_command() -> None:
    result = _cli("--help")
    assert result.returncode == 0, result.stderr
    for command in ("plan", "render", "build", "sign", "verify", "serve", "check"):
        assert command in result.stdout


def test_a_kernelbake_command_after_the_entrypoints_serve_runs_that_command() -> None:
    """``docker run IMAGE check --json`` is ``kernelbake serve check --json`` in the image."""
    from kernelbake.cli import image_command

    assert image_command(["serve", "check", "--json"]) == ["check", "--json"]
    assert image_command(["serve", "kernelbake", "check"]) == ["check"]
    assert image_command(["serve", "seed-cache", "/cache"]) == ["seed-cache", "/cache"]
    assert image_command(["serve", "serve", "--max-num-seqs", "8"]) == ["serve", "--max-num-seqs", "8"]
    # Options (and their values) still go to the engine; other commands are left alone.
    assert image_command(["serve", "--max-model-len", "512"]) == ["serve", "--max-model-len", "512"]
    assert image_command(["serve"]) == ["serve"]
    assert image_command(["check", "serve"]) == ["check", "serve"]


def test_the_entrypoint_runs_check_for_docker_run_image_check() -> None:
    # No target file here: check itself runs and says so (exit 2), instead of the engine
    # starting with 'check' as its model.
    result = _cli("serve", "check", "--json")
    assert result.returncode != 0
    assert result.stderr.startswith("kernelbake check: error:"), result.stderr
    assert "+ " not in result.stderr  # nothing was started


@pytest.mark.parametrize(
    ("words", "refused"),
    [
        (["serve", "Qwen/Qwen3-8B"], "Qwen/Qwen3-8B"),
        (["serve", "plan", "x.yaml"], "plan"),
        (["serve", "kernelbake", "nope"], "nope"),
    ],
)
def test_a_stray_positional_is_refused_before_the_engine_starts(words: list[str], refused: str) -> None:
    result = _cli(*words)
    assert result.returncode == 2
    message = result.stderr.strip()
    assert "\n" not in message and not result.stdout
    assert message.startswith(f"kernelbake serve: error: {refused!r} is neither an option nor a command")
    assert "(capture, check, compile, engine-command, fetch-model, seed-cache, serve, snapshot)" in message


def test_engine_command_prints_what_serve_would_exec(tmp_path: Path) -> None:
    """What a build records on the cache artifact: the engine's own command for the target."""
    from kernelbake.plan import plan
    from kernelbake.render import target_config
    from kernelbake.spec import load_spec

    (target,) = plan(load_spec(REPO / "images" / "tiny-llama-torch.yaml"), ["cpu"], registry="r")
    (tmp_path / "target.json").write_text(target_config(target).to_json())
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK_HOST_DEPS, "engine-command"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**os.environ, "KERNELBAKE_UNSAFE_TARGET": str(tmp_path / "target.json")},
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["command"][1:3] == ["-m", "kernelbake.runtime.engines.torch_serve"]
    assert isinstance(doc["env"], dict)
