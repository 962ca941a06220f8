"""The bench scripts (bench/*.py are scripts, not a package), loaded as modules for tests."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
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


def render_default_cpu(out: Path) -> Path:
    """The default image's build context for the CPU (``kernelbake render images/tiny-llama.yaml
    --gpu cpu``) under ``out``, which the GPU harness plays on the vLLM CPU base image; ``out``."""
    subprocess.run(
        [sys.executable, "-m", "kernelbake", "render", str(REPO / "images/tiny-llama.yaml"), "--gpu", "cpu", "--out", str(out)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return out
