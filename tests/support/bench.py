"""The bench scripts (bench/*.py are scripts, not a package), loaded as modules for tests."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.conftest import REPO


def load(name: str) -> ModuleType:
    """bench/NAME.py, executed afresh as the module ``NAME``."""
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up by name.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
