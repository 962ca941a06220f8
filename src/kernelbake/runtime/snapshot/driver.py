"""The GPU driver's half of a snapshot: the device facts the key records, and the
checkpoint calls (``cuCheckpointProcess*``) that move a CUDA process's device state into its
host memory before CRIU dumps it and back after CRIU restores it.

One small Protocol; ``NoDriver`` stands in on a machine without a GPU (every call a no-op, the
key's GPU fields ``none``), so a CPU image takes and restores snapshots by the same code path.
Tests inject their own."""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, Protocol

from kernelbake.contract.key import NONE
from kernelbake.errors import EnvironmentProblem
from kernelbake.runtime import probe


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceFacts:
    gpu: str  # "NVIDIA H200, 143771 MiB, 132 SMs" or "none"
    gpu_count: int
    driver: str
    cuda_driver_api: str


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """One GPU's memory as NVML counts it, in bytes."""

    index: int
    total: int
    free: int
    used: int


class Driver(Protocol):
    def facts(self) -> DeviceFacts: ...

    def memory(self) -> tuple[DeviceMemory, ...]:
        """Each GPU's memory now; empty where it cannot be asked (then nothing is checked)."""
        ...

    def checkpoint(self, pid: int) -> None:
        """Lock, then checkpoint ``pid``'s device state into its host memory."""
        ...

    def restore(self, pid: int) -> None:
        """Restore ``pid``'s device state, then unlock it."""
        ...


class NoDriver:
    """No GPU: nothing to move; the key records none."""

    def facts(self) -> DeviceFacts:
        return DeviceFacts(gpu=NONE, gpu_count=0, driver=NONE, cuda_driver_api=NONE)

    def memory(self) -> tuple[DeviceMemory, ...]:
        return ()

    def checkpoint(self, pid: int) -> None:
        return None

    def restore(self, pid: int) -> None:
        return None


class CudaDriver:
    """``libcuda`` through ctypes, the calls ``bench/vllm_snapshot_probe.py`` measured on the H200."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._cuda = lib

    def _call(self, name: str, *args: object) -> None:
        rc = getattr(self._cuda, name)(*args)
        if rc != 0:
            raise EnvironmentProblem(f"the driver's {name} failed with CUresult {rc}{self._said(rc)}")

    def _said(self, rc: int) -> str:
        """What the driver calls ``rc`` (``cuGetErrorName``/``cuGetErrorString``), asked of the
        driver rather than a table of ours, so a code a later driver adds is named too; empty
        where it does not know it."""
        words = []
        for ask in ("cuGetErrorName", "cuGetErrorString"):
            text = ctypes.c_char_p()
            if getattr(self._cuda, ask)(rc, ctypes.byref(text)) == 0 and text.value:
                words.append(text.value.decode(errors="replace"))
        return f" ({': '.join(words)})" if words else ""

    def facts(self) -> DeviceFacts:
        count, version = ctypes.c_int(), ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(count))
        self._call("cuDriverGetVersion", ctypes.byref(version))
        devices = []
        for i in range(count.value):
            dev, mem, sms = ctypes.c_int(), ctypes.c_size_t(), ctypes.c_int()
            name = ctypes.create_string_buffer(256)
            self._call("cuDeviceGet", ctypes.byref(dev), i)
            self._call("cuDeviceGetName", name, 256, dev)
            self._call("cuDeviceTotalMem_v2", ctypes.byref(mem), dev)
            # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
            self._call("cuDeviceGetAttribute", ctypes.byref(sms), 16, dev)
            devices.append(f"{name.value.decode()}, {mem.value >> 20} MiB, {sms.value} SMs")
        # Every device must be the same kind for one key; a mixed node says so in full.
        gpu = devices[0] if len(set(devices)) == 1 else " | ".join(devices) if devices else NONE
        return DeviceFacts(
            gpu=gpu, gpu_count=count.value, driver=probe.nvidia_driver(), cuda_driver_api=str(version.value)
        )

    def memory(self) -> tuple[DeviceMemory, ...]:
        """Asked of NVML, not of CUDA: a context would hold device memory of its own (and show
        in the count) and keep the GPU's files open in this process. NVML is shut down again
        before this returns. Empty where NVML does not load or answer."""
        return nvml_memory()

    def _process(self, name: str, pid: int) -> None:
        args = (ctypes.c_uint32 * 16)()  # the *Args structs: zeroed, timeout 0 (none)
        self._call(f"cuCheckpointProcess{name}", pid, ctypes.byref(args))

    def checkpoint(self, pid: int) -> None:
        self._process("Lock", pid)
        self._process("Checkpoint", pid)

    def restore(self, pid: int) -> None:
        self._process("Restore", pid)
        self._process("Unlock", pid)


def machine_driver() -> Driver:
    """``CudaDriver`` where ``libcuda`` loads and initialises with a device, else ``NoDriver``."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return NoDriver()
    count = ctypes.c_int()
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return NoDriver()
    return CudaDriver(lib)


def rise(before: tuple[DeviceMemory, ...], after: tuple[DeviceMemory, ...]) -> int | None:
    """The largest rise in used memory of any GPU from ``before`` to ``after`` (what a process
    started between them holds there, the driver's own reservation left out); None where either
    could not be asked."""
    if not before or not after:
        return None
    was = {m.index: m.used for m in before}
    return max(max(m.used - was.get(m.index, 0), 0) for m in after)


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_memory(nvml: Any = None) -> tuple[DeviceMemory, ...]:
    """Each GPU's memory (``nvmlDeviceGetMemoryInfo``), or empty where NVML does not load or
    answer (``nvml``: libnvidia-ml as ctypes shows it; loaded here when None)."""
    if nvml is None:
        try:
            nvml = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return ()
    if nvml.nvmlInit_v2() != 0:
        return ()
    try:
        count = ctypes.c_uint()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return ()
        found = []
        for i in range(count.value):
            handle, info = ctypes.c_void_p(), _NvmlMemory()
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) != 0:
                return ()
            if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(info)) != 0:
                return ()
            found.append(DeviceMemory(index=i, total=info.total, free=info.free, used=info.used))
        return tuple(found)
    finally:
        nvml.nvmlShutdown()
