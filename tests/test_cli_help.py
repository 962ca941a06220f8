"""What `--help` says: `docker run IMAGE --help` (the entrypoint's `serve --help`) lists the
image's commands, and every option of every command has one name."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

from kernelbake.cli import _IN_IMAGE, build_parser
from kernelbake.cli._reference import _commands
from tests.conftest import REPO


def _entrypoint() -> list[str]:
    """The images' ENTRYPOINT, as the Dockerfile template writes it, on this interpreter."""
    text = (REPO / "templates" / "Dockerfile.j2").read_text()
    match = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    assert match is not None
    argv: list[str] = json.loads(match.group(1))
    assert argv[0] == "python3"
    return [sys.executable, *argv[1:]]


def test_docker_run_image_help_lists_the_image_s_commands() -> None:
    res = subprocess.run(
        [*_entrypoint(), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("usage: kernelbake serve [ENGINE ARGS...]")
    helps = {path[0]: h.removeprefix("(inside the image) ") for path, h, _ in _commands(build_parser())}
    lines = res.stdout.splitlines()
    for command in sorted(set(_IN_IMAGE) - {"serve"}):
        assert [ln for ln in lines if ln.split()[:1] == [command] and ln.endswith(helps[command])], (
            command,
            res.stdout,
        )
    assert "docker run IMAGE COMMAND" in res.stdout


def test_every_option_of_every_command_has_one_name() -> None:
    """An alias (``-v, --verbose``) is a second spelling to document and to keep apart from the
    engine's options that serve and check pass on; only argparse's own -h/--help has two."""
    twice = [
        f"kernelbake {' '.join(path)}: {', '.join(action.option_strings)}"
        for path, _, parser in _commands(build_parser())
        for action in parser._actions
        if len(action.option_strings) > 1 and not isinstance(action, argparse._HelpAction)
    ]
    assert twice == []
