"""The admission wing's import contracts (pyproject.toml, checked by ``make lint``) hold, and each
fails when a bad import is planted in a copy of the package: HTTP above the service above the
rules, each rule module alone, the rules never reaching the gateway's I/O."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

LINT = Path(sys.executable).with_name("lint-imports")
CONTRACTS = ("admission", "admission-rules", "admission-http")


def _lint(tmp_path: Path, plant: tuple[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """lint-imports with the project's admission contracts on a copy of the package, with
    ``plant`` (a module under kernelbake/admission, an import) appended."""
    src = tmp_path / "src"
    shutil.copytree(
        REPO / "src" / "kernelbake", src / "kernelbake", ignore=shutil.ignore_patterns("__pycache__")
    )
    if plant is not None:
        module, line = plant
        path = src / "kernelbake" / "admission" / module
        path.write_text(f"{path.read_text()}\n{line}\n")
    return subprocess.run(
        [str(LINT), str(REPO / "pyproject.toml"), "--no-cache", *(f"--contract={c}" for c in CONTRACTS)],
        env={**os.environ, "PYTHONPATH": str(src)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_admission_contracts_hold(tmp_path: Path) -> None:
    found = _lint(tmp_path)
    assert found.returncode == 0, found.stdout + found.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in found.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # One rule reading another: the table would no longer say what each denies alone.
        (
            "rules/gpu.py",
            "from kernelbake.admission.rules import signature",
            "rules.gpu is not allowed to import",
        ),
        # A rule doing I/O: the decision must stay pure.
        (
            "rules/delta.py",
            "from kernelbake.admission import gateway",
            "rules.delta -> kernelbake.admission.gateway",
        ),
        # The service knowing its transport.
        ("service.py", "from kernelbake.admission.http import server", "service is not allowed to import"),
        # The shared facts reaching up to a rule.
        (
            "rules/facts.py",
            "from kernelbake.admission.rules import snapshot_restore",
            "rules.facts is not allowed",
        ),
        # A probe reaching into the server it stands beside.
        ("http/health.py", "from kernelbake.admission.http import server", "http.health is not allowed"),
    ],
)
def test_a_planted_bad_import_breaks_its_contract(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    found = _lint(tmp_path, (module, line))
    assert found.returncode != 0
    assert broken in " ".join(found.stdout.split()), found.stdout
