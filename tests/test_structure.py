"""The structure docs/architecture.md describes, checked by the tools that keep it: the import
contracts in pyproject.toml fail when an import that breaks a rule of the image code is planted
in a copy of the tree, and no function is longer than the project allows."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SRC = REPO / "src" / "kernelbake"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
MAX_LINES = 80


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(tree / "pyproject.toml")],
        cwd=tree,
        env={"PYTHONPATH": str(tree / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(SRC, root / "src" / "kernelbake", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root)
    return root


def test_the_tree_as_it_is_keeps_every_contract(tree: Path) -> None:
    done = _lint_imports(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        # The rooms of the image code import none of each other.
        ("runtime/serve/start.py", "from kernelbake.runtime.compile import stage", "The image code"),
        ("runtime/capture/record.py", "from kernelbake.runtime.serve import delta", "The image code"),
        ("runtime/compile/stage.py", "from kernelbake.runtime.capture import collect", "The image code"),
        # The engines lie beneath the rooms: none calls the preflight back.
        (
            "runtime/engines/torch_engine.py",
            "from kernelbake.runtime.serve import preflight",
            "The image code",
        ),
        # What every room shares imports none of them.
        ("runtime/bundle.py", "from kernelbake.runtime.capture import collect", "The image code"),
        # Host code never reaches the image code.
        ("signing/delta.py", "from kernelbake.runtime import bundle", "Host code never imports image code"),
        # Host modules on one line of the layers are independent of each other.
        ("plan.py", "import kernelbake.fleet", "Layers: cli above host and image code"),
    ],
)
def test_a_planted_import_that_breaks_a_rule_breaks_its_contract(
    tree: Path, module: str, planted: str, broken: str
) -> None:
    path = tree / "src" / "kernelbake" / module
    before = path.read_text()
    try:
        path.write_text(before + f"\n{planted}  # planted\n")
        done = _lint_imports(tree)
    finally:
        path.write_text(before)
    assert done.returncode != 0
    broken_section = done.stdout.split("Broken contracts", 1)[-1].splitlines()
    assert any(line.startswith(broken) for line in broken_section), done.stdout


def _long_functions() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                if (lines := node.end_lineno - node.lineno + 1) > MAX_LINES:
                    found.append(f"{rel}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_80_lines() -> None:
    assert _long_functions() == []
