"""CRIU for the tests, installed as `make criu` installs it: images/base/criu/install.sh from the
.debs criu.lock pins (kept in .cache/criu-debs after the first download)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import REPO


def install(where: Path) -> Path:
    """CRIU's private prefix at ``where`` (installed unless ``bin/criu`` is there already)."""
    if not (where / "bin" / "criu").is_file():
        env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "KEEP": str(REPO / ".cache" / "criu-debs")}
        subprocess.run(
            [str(REPO / "images/base/criu/install.sh"), str(where)], env=env, check=True, timeout=600
        )
    return where
