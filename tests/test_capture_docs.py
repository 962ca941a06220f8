"""docs/capture.md says what the code does: its commands parse as the CLI parses them
(tests/integration/test_runbooks.py runs the page), the refusal line it quotes is serve's, and
the recipe it names is the one the webhook test reviews."""

from __future__ import annotations

from pathlib import Path

from kernelbake.cli import build_parser
from kernelbake.contract.delta import DELTA_ROOT
from kernelbake.runtime.delta import DeltaOutcome
from tests.conftest import REPO
from tests.test_docs import blocks, commands

DOC = REPO / "docs" / "capture.md"


def test_every_command_of_the_flow_parses() -> None:
    # The Docker flow is run by tests/integration/test_runbooks.py; this checks its kernelbake
    # words, and the cluster variant's, as the CLI parses them, without Docker.
    text = DOC.read_text()
    found = [c for tag in ("capture", "capture-cluster") for b in blocks(text, tag) for c in commands(b)]
    parsed = []
    for words in found:
        if "kernelbake" in words:
            at = words.index("kernelbake")
            # Up to a pipe (``| tee``): what follows is another command.
            argv = words[at + 1 : words.index("|")] if "|" in words else words[at + 1 :]
            build_parser().parse_args(argv)
            parsed.append(words[at + 1 : at + 3])
    assert parsed == [
        ["capture", "collect"],
        ["capture", "push"],
        ["capture", "verify"],
        ["capture", "collect"],
    ]


def test_the_refusal_line_is_serves() -> None:
    line = DeltaOutcome(where=Path(DELTA_ROOT), used=False, reason="…").line()
    assert f"kernelbake serve: {line}" in DOC.read_text()
    assert (REPO / "deploy" / "examples" / "serve-delta.yaml").exists()
