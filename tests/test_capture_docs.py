"""docs/capture.md says what the code does: its commands parse as the CLI parses them (the
bench, bench/capture_cpu.py, runs them for real), the refusal line it quotes is serve's, and
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
    found = [c for b in blocks(DOC.read_text(), "capture") for c in commands(b)]
    parsed = 0
    for words in found:
        if "kernelbake" in words:
            at = words.index("kernelbake")
            build_parser().parse_args(words[at + 1 :])
            parsed += 1
        else:
            assert words[:2] == ["kubectl", "cp"], words
    assert parsed == 3


def test_the_refusal_line_is_serves() -> None:
    line = DeltaOutcome(where=Path(DELTA_ROOT), used=False, reason="…").line()
    assert f"kernelbake serve: {line}" in DOC.read_text()
    assert (REPO / "deploy" / "examples" / "serve-delta.yaml").exists()
