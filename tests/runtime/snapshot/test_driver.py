"""CudaDriver's failures name the driver's code as the driver names it."""

from __future__ import annotations

from typing import Any

import pytest

from kernelbake.errors import EnvironmentProblem
from kernelbake.runtime.snapshot.driver import CudaDriver, DeviceMemory, nvml_memory


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


class _Nvml:
    """libnvidia-ml as ctypes shows it: each call returns an nvmlReturn_t and writes through
    the pointers it is given; ``fail`` names the one call that answers 999 (NVML_ERROR_UNKNOWN)."""

    def __init__(self, memory: list[tuple[int, int, int]], fail: str = "") -> None:
        self.memory, self.fail, self.shutdowns = memory, fail, 0

    def _rc(self, name: str) -> int:
        return 999 if name == self.fail else 0

    def nvmlInit_v2(self) -> int:
        return self._rc("nvmlInit_v2")

    def nvmlShutdown(self) -> int:
        self.shutdowns += 1
        return 0

    def nvmlDeviceGetCount_v2(self, out: Any) -> int:
        out._obj.value = len(self.memory)
        return self._rc("nvmlDeviceGetCount_v2")

    def nvmlDeviceGetHandleByIndex_v2(self, index: int, out: Any) -> int:
        out._obj.value = index + 1
        return self._rc("nvmlDeviceGetHandleByIndex_v2")

    def nvmlDeviceGetMemoryInfo(self, handle: Any, out: Any) -> int:
        out._obj.total, out._obj.free, out._obj.used = self.memory[handle.value - 1]
        return self._rc("nvmlDeviceGetMemoryInfo")


def test_each_gpus_memory_is_asked_of_nvml_which_is_shut_down_again() -> None:
    lib = _Nvml([(80, 70, 10), (80, 4, 76)])
    assert nvml_memory(lib) == (
        DeviceMemory(index=0, total=80, free=70, used=10),
        DeviceMemory(index=1, total=80, free=4, used=76),
    )
    assert lib.shutdowns == 1


@pytest.mark.parametrize(
    "fail",
    ["nvmlInit_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetMemoryInfo"],
)
def test_an_nvml_that_does_not_answer_is_no_memory_and_nothing_checked(fail: str) -> None:
    """No answer is never a number: the gate checks nothing rather than a GPU of zero bytes."""
    lib = _Nvml([(80, 70, 10)], fail=fail)
    assert nvml_memory(lib) == ()
    # Shut down exactly as often as it was initialised (NVML counts them).
    assert lib.shutdowns == (0 if fail == "nvmlInit_v2" else 1)
