"""docs/capture.md says what the code does: its commands parse as the CLI parses them
(bench/capture_cpu.py runs the same steps for real), the lines it quotes are serve's and the
verifier's, and the recipe it names is the one the webhook test reviews; docs/capture-trust.md
names the policy setting and the flag the code has."""

from __future__ import annotations

from pathlib import Path

from kernelbake.cli import build_parser
from kernelbake.contract.delta import DELTA_ROOT
from kernelbake.runtime.serve.delta import DeltaOutcome
from kernelbake.signing.delta import UNSAFE_SETTING
from kernelbake.signing.policy import VerifyPolicy
from tests.conftest import REPO
from tests.test_docs import blocks, commands

DOC = REPO / "docs" / "capture.md"
TRUST = REPO / "docs" / "capture-trust.md"


def test_every_command_of_the_flow_parses() -> None:
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
        ["capture", "record"],
        ["capture", "rebuild"],
        ["capture", "push"],
        ["capture", "verify"],
        ["capture", "record"],
    ]


def test_the_quoted_lines_are_serves() -> None:
    text = DOC.read_text()
    line = DeltaOutcome(where=Path(DELTA_ROOT), used=False, reason="…").line()
    assert f"kernelbake serve: {line}" in text
    merged = DeltaOutcome(where=Path(DELTA_ROOT), used=True, digest="sha256:…", origin="rebuilt", builder="…")
    head = merged.line().split(": ")[0]
    assert f"kernelbake serve: {head}: … files" in text
    assert (REPO / "deploy" / "examples" / "serve-delta.yaml").exists()


def test_the_trust_page_names_what_the_code_has() -> None:
    text = TRUST.read_text()
    assert UNSAFE_SETTING in text and "--unsafe-replica-bytes" in text
    assert "unsafe_replica_deltas" in VerifyPolicy.__dataclass_fields__
    assert "(capture-trust.md)" in DOC.read_text()
