"""CudaDriver's failures name the driver's code as the driver names it."""

from __future__ import annotations

from typing import Any

import pytest

from kernelbake.errors import EnvironmentProblem
from kernelbake.runtime.snapshot.driver import CudaDriver


class _Lib:
    """libcuda as ctypes shows it: each call returns a CUresult; the error calls write a
    ``const char *`` through the pointer they are given."""

    def __init__(self, rc: int, names: dict[int, tuple[str, str]]) -> None:
        self.rc, self.names = rc, names

    def cuCheckpointProcessLock(self, pid: int, args: Any) -> int:
        return self.rc

    def cuCheckpointProcessCheckpoint(self, pid: int, args: Any) -> int:
        return 0

    def _error(self, which: int, rc: int, out: Any) -> int:
        if rc not in self.names:
            return 1  # CUDA_ERROR_INVALID_VALUE: a code this driver does not know
        out._obj.value = self.names[rc][which].encode()
        return 0

    def cuGetErrorName(self, rc: int, out: Any) -> int:
        return self._error(0, rc, out)

    def cuGetErrorString(self, rc: int, out: Any) -> int:
        return self._error(1, rc, out)


def test_a_failed_call_says_what_the_driver_calls_its_code() -> None:
    lib = _Lib(2, {2: ("CUDA_ERROR_OUT_OF_MEMORY", "out of memory")})
    with pytest.raises(EnvironmentProblem) as err:
        CudaDriver(lib).checkpoint(1234)  # type: ignore[arg-type]
    assert str(err.value) == (
        "the driver's cuCheckpointProcessLock failed with CUresult 2 (CUDA_ERROR_OUT_OF_MEMORY: out of memory)"
    )


def test_a_code_the_driver_cannot_name_is_said_as_a_number() -> None:
    with pytest.raises(EnvironmentProblem) as err:
        CudaDriver(_Lib(3, {})).checkpoint(1234)  # type: ignore[arg-type]
    assert str(err.value) == "the driver's cuCheckpointProcessLock failed with CUresult 3"
