"""Small probes of the running system, shared by engines; tests monkeypatch them."""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from pathlib import Path

from kernelbake.contract.key import NONE
from kernelbake.contract.platform import arch_for

_NVIDIA_VERSION = Path("/proc/driver/nvidia/version")
_KERNEL_MODULE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)")


def python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def machine() -> str:
    return platform.machine()


def public_version(version: str) -> str:
    """``2.13.0+cpu`` → ``2.13.0``: the local part names the wheel variant, which the key
    records separately (cuda)."""
    return version.split("+", 1)[0]


def dist_version(name: str) -> str:
    try:
        return public_version(importlib.metadata.version(name))
    except importlib.metadata.PackageNotFoundError:
        return NONE


def nvidia_driver() -> str:
    """The loaded NVIDIA kernel module's version, as the container sees it, else NVML's
    answer (sandboxed runtimes may hide /proc/driver), else ``none``."""
    try:
        m = _KERNEL_MODULE.search(_NVIDIA_VERSION.read_text())
        if m:
            return m.group(1)
    except OSError:
        pass
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]

        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return NONE


def cuda_device() -> tuple[str, str, str]:
    """(device name, arch, torch's CUDA version) of GPU 0, or ``none``s without one."""
    import torch

    cuda = torch.version.cuda or NONE
    if not torch.cuda.is_available():
        return NONE, NONE, cuda
    major, minor = torch.cuda.get_device_capability(0)
    name = torch.cuda.get_device_name(0)
    return name, arch_for((int(major), int(minor))), cuda
