"""The docs say what the code does: the CLI reference is generated and current, it names every
variable and exit code the code has, and the README stays a manual (its commands are real)."""

from __future__ import annotations

import argparse
import ast
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kernelbake import settings
from kernelbake.cli import _reference, build_parser
from kernelbake.contract.envvars import DeclaredEnv, UndeclaredVariable, Variable
from kernelbake.runtime import env as runtime_env
from tests.conftest import REPO
from tests.support.runbook import commands, shown_line

README = REPO / "README.md"
REFERENCE = REPO / _reference.REFERENCE


def test_the_cli_reference_is_current() -> None:
    if REFERENCE.read_text() != _reference.render():
        pytest.fail("docs/reference/cli.md is stale: run `make docs`")


def _env_reads(path: Path, module: object) -> set[str]:
    """The variable names the module reads anywhere as ``env.get(NAME…)``/``env[NAME]`` (``from_env``
    and the helpers it hands ``env`` to), with NAME a string literal or one of the module's names."""
    tree = ast.parse(path.read_text())
    consts = {k: v for k, v in vars(module).items() if isinstance(v, str)}
    fn = tree
    names: set[str] = set()
    for node in ast.walk(fn):
        arg = None
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "env"
        ):
            arg = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "env":
            arg = node.slice
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.add(arg.value)
        elif isinstance(arg, ast.Name):
            names.add(consts[arg.id])
    return names


@pytest.mark.parametrize(
    ("path", "module"),
    [
        (REPO / "src/kernelbake/settings.py", settings),
        (REPO / "src/kernelbake/runtime/env.py", runtime_env),
    ],
)
def test_each_side_declares_exactly_the_variables_it_reads(path: Path, module: Any) -> None:
    variables: tuple[Variable, ...] = module.VARIABLES
    assert _env_reads(path, module) == {v.name for v in variables}
    text = REFERENCE.read_text()
    for v in variables:
        assert f"| `{v.name}` |" in text


def test_reading_an_undeclared_variable_is_refused_and_every_declared_one_reads() -> None:
    environ = DeclaredEnv({"A": "1", "B": "2"}, [Variable("A", "a")])
    assert environ.get("A") == "1" and environ["A"] == "1" and dict(environ) == {"A": "1", "B": "2"}
    with pytest.raises(UndeclaredVariable, match=r"\$B is read but not declared"):
        environ.get("B")
    everything = {v.name: "1" for v in settings.VARIABLES}
    assert settings.Settings.from_env(everything).registry == "1"
    assert settings.Settings.from_env({}).environ == {}


def test_every_exit_code_in_the_source_is_in_the_reference() -> None:
    codes = set()
    for path in (REPO / "src/kernelbake").rglob("*.py"):
        codes |= {int(c) for c in re.findall(r"^\s+return_code = (\d+)$", path.read_text(), re.M)}
    listed = {int(c) for c in re.findall(r"^\| (\d+) \|", REFERENCE.read_text(), re.M)}
    assert codes <= listed, sorted(codes - listed)


# --- the README ---------------------------------------------------------------------------

README_LIMIT = 300


def test_the_readme_is_a_manual_of_at_most_300_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= README_LIMIT, len(lines)


def _links(text: str) -> list[tuple[str, str]]:
    """(file, anchor) of every relative Markdown link; file "" for an anchor in the same page."""
    found = re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text)
    return [(f, a) for f, a in found if not f.startswith(("http://", "https://"))]


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lowercase, punctuation dropped, spaces to -."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    heads = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


DOCS = [
    README,
    REPO / "CHANGELOG.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "docs").glob("*/*.md")),
]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_names_a_file_and_heading_that_exist(doc: Path) -> None:
    broken = []
    for file, anchor in _links(doc.read_text()):
        target = (doc.parent / file) if file else doc
        if not target.exists():
            broken.append(file)
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{file}#{anchor}")
    assert not broken, f"{doc.relative_to(REPO)}: {broken}"


def blocks(text: str, tag: str) -> list[str]:
    """Fenced blocks that follow the comment ``<!-- tag -->``, or a runbook marker with the tag
    among its words (``<!-- runbook: commands given -->``, tests/support/runbook.py)."""
    marker = rf"<!-- (?:{re.escape(tag)}|runbook:(?: [^>]*?)? {re.escape(tag)}(?: [^>]*?)?) -->"
    return re.findall(rf"{marker}\s*```(?:sh|console)?\n(.*?)```", text, re.S)


# A warm start's lines, which test_docs_run checks in the README's sample against a real run.
WARM_START = ("kernelbake serve: baked caches valid", "kernelbake serve: start-up compiled nothing")


@pytest.mark.parametrize("doc", DOCS[2:], ids=lambda p: str(p.relative_to(REPO)))
def test_a_warm_starts_lines_on_a_page_are_those_of_the_readmes_checked_sample(doc: Path) -> None:
    # Issue 44: docs/engines.md showed "55 files, engine caches at …" after serve had long
    # printed 67 files and the time their sha256 took; the README's sample is the one checked.
    (sample,) = blocks(README.read_text(), "serve-output")
    printed = [ln for ln in sample.splitlines() if ln.startswith(WARM_START)]
    assert len(printed) == len(WARM_START), sample
    shown = [ln.strip() for ln in doc.read_text().splitlines() if ln.strip().startswith(WARM_START)]
    stale = [ln for ln in shown if not any(shown_line(ln).fullmatch(p) for p in printed)]
    assert stale == [], f"{doc.relative_to(REPO)}: not as the README's sample: {stale}"


def _parses(words: list[str]) -> None:
    parser = build_parser()
    # serve and check pass unknown options to the engine: parse_known_args as main() does.
    args, extra = parser.parse_known_args(words)
    assert not extra or getattr(args, "passthrough", False), (words, extra)


def _image_words(words: list[str]) -> list[str]:
    """What follows the image in ``docker run [flags] IMAGE WORDS``."""
    run = argparse.ArgumentParser(add_help=False)
    for flag in ("--shm-size", "-p", "-v", "--user", "--tmpfs", "-e", "--name", "--ipc"):
        run.add_argument(flag, action="append")
    for flag in ("--rm", "--read-only", "-d"):
        run.add_argument(flag, action="store_true")
    run.add_argument("rest", nargs=argparse.REMAINDER)
    ns = run.parse_args(words[2:])
    return list(ns.rest[1:])


def test_the_readme_quick_start_names_real_targets_commands_and_options() -> None:
    text = README.read_text()
    found = [c for tag in ("quick-start", "commands") for b in blocks(text, tag) for c in commands(b)]
    assert len(blocks(text, "quick-start")) >= 2 and found
    make_targets = []
    for words in found:
        if words == ["IMAGE=$(cat", "build/image.ref)"]:
            # What `make image` writes there: the reference it pushed (Makefile, build-image).
            makefile = (REPO / "Makefile").read_text()
            assert "BUILD := build" in makefile and "> $(BUILD)/image.ref" in makefile
        elif words[:1] == ["export"] and words[1].startswith("PATH="):
            # The set-up line: the directory it puts first is the venv's bin, where deps.sh
            # installs the CLI (the Makefile's KB).
            assert words == ["export", "PATH=$PWD/.venv/bin:$PATH"], words
            assert "VENV := .venv" in (REPO / "Makefile").read_text()
            assert "KB := $(VENV)/bin/kernelbake" in (REPO / "Makefile").read_text()
        elif words[0] == "make":
            make_targets.append(words)
        elif words[0] == "kernelbake":
            _parses(words[1:])
        elif words[:2] == ["docker", "run"]:
            rest = _image_words(words)
            _parses(["serve", *rest] if not rest or rest[0].startswith("-") else rest)
        elif words[0] == "curl":
            assert "/v1/completions" in " ".join(words)
        else:
            pytest.fail(f"a README command nobody checks: {shlex.join(words)}")
    for words in make_targets:
        # -n: print what would run, run nothing (IMAGE= keeps the verify target from needing a build).
        done = subprocess.run(
            ["make", "-n", *words[1:], "IMAGE=127.0.0.1:5000/kernelbake/x@sha256:" + "0" * 64],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, (words, done.stderr)
