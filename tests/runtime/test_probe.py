"""GPU 0 is asked of a child process (``kernelbake.runtime.gpu_query``), so that serve's
supervisor, the root of the tree a snapshot dumps, never opens the GPU itself."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from kernelbake.errors import EnvironmentProblem
from kernelbake.runner import Result
from kernelbake.runtime import probe
from tests.conftest import REPO

# A stand-in torch for the child: GPU 0 an H100 (sm_90), or none with GPU=0 in the environment.
FAKE_TORCH = """
import os
class version:
    cuda = "13.0"
class cuda:
    @staticmethod
    def is_available():
        return os.environ.get("GPU") != "0"
    @staticmethod
    def get_device_capability(i):
        return (9, 0)
    @staticmethod
    def get_device_name(i):
        return "NVIDIA H100 80GB HBM3"
"""


@pytest.mark.parametrize("gpu", [True, False])
def test_the_child_reports_gpu_0_as_torch_sees_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: bool
) -> None:
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO / 'src'}")
    monkeypatch.setenv("GPU", "1" if gpu else "0")
    # torch was never imported here: the asking process stays off the GPU.
    assert "torch" not in sys.modules
    found = probe.cuda_device()
    assert found == (("NVIDIA H100 80GB HBM3", "sm_90a", "13.0") if gpu else ("none", "none", "13.0"))
    assert "torch" not in sys.modules


def test_a_child_that_fails_is_one_line_with_its_last_words() -> None:
    def runner(argv: Any, **kwargs: Any) -> Result:
        assert (
            argv[1:] == ["-m", "kernelbake.runtime.gpu_query"]
            and kwargs["timeout"] == probe.GPU_QUERY_TIMEOUT_S
        )
        return Result(tuple(argv), 1, "", "Traceback ...\nRuntimeError: CUDA driver initialization failed\n")

    with pytest.raises(EnvironmentProblem) as err:
        probe.cuda_device(runner)
    assert str(err.value) == (
        "asking torch about GPU 0 failed (exit 1): RuntimeError: CUDA driver initialization failed"
    )
    with pytest.raises(EnvironmentProblem, match=r"exit 0\): JSONDecodeError: Expecting value"):
        probe.cuda_device(lambda argv, **_: Result(tuple(argv), 0, "not json\n", ""))
