"""``use_baked_caches`` at the path the docs gave before it moved to ``runtime.serve.scripts``:
the old import fails, and its message names the new path and when it moved."""

from __future__ import annotations

import subprocess
import sys

import pytest

NEW_PATH = r"kernelbake\.runtime\.serve\.scripts\.use_baked_caches on 2026-12-05"


def test_the_old_documented_import_fails_naming_the_new_path_and_when_it_moved() -> None:
    with pytest.raises(ImportError, match=NEW_PATH):
        from kernelbake.runtime.engines.torch_engine import use_baked_caches  # noqa: F401


def test_a_users_script_sees_the_message_not_a_bare_cannot_import_name() -> None:
    code = "from kernelbake.runtime.engines.torch_engine import use_baked_caches\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: kernelbake.runtime.engines.torch_engine.use_baked_caches moved to ")
    assert "cannot import name" not in done.stderr


def test_the_old_path_imports_nothing_of_serve() -> None:
    code = (
        "import sys\n"
        "from kernelbake.runtime.engines import torch_engine\n"
        "try:\n"
        "    torch_engine.use_baked_caches\n"
        "except ImportError:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('kernelbake.runtime.serve')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_another_missing_name_is_still_an_import_error() -> None:
    with pytest.raises(ImportError, match="no_such_name"):
        from kernelbake.runtime.engines.torch_engine import no_such_name  # noqa: F401
