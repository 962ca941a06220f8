"""``use_baked_caches`` at the path the docs gave before it moved to ``runtime.serve.scripts``:
users' scripts and Dockerfiles that import it the old way keep working, and are told where it went."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kernelbake.runtime.serve import scripts


def test_the_old_documented_import_gives_the_same_function_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"kernelbake\.runtime\.serve\.scripts\.use_baked_caches"):
        from kernelbake.runtime.engines.torch_engine import use_baked_caches
    assert use_baked_caches is scripts.use_baked_caches


def test_the_warning_names_the_users_own_line_and_shows_by_default() -> None:
    # A user's script is __main__, where Python shows a DeprecationWarning without -W.
    code = "from kernelbake.runtime.engines.torch_engine import use_baked_caches\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (
        "<string>:1: DeprecationWarning: kernelbake.runtime.engines.torch_engine.use_baked_caches"
        in done.stderr
    )


def test_another_missing_name_is_still_an_import_error() -> None:
    with pytest.raises(ImportError, match="no_such_name"):
        from kernelbake.runtime.engines.torch_engine import no_such_name  # noqa: F401
