"""Probes of the machine a container runs on. Each is a tiny function tests can replace."""

from __future__ import annotations

import platform
import re
from importlib import metadata
from pathlib import Path

from kernelbake.key import NONE

# Architecture-specific ("a") targets are what Hopper and Blackwell kernels are built for
# (wgmma, TMA); their cubins do not run on other capabilities, so the key says so.
_ARCH_SPECIFIC = {(9, 0), (10, 0), (10, 3), (12, 0), (12, 1)}


def arch_for_capability(major: int, minor: int) -> str:
    suffix = "a" if (major, minor) in _ARCH_SPECIFIC else ""
    return f"sm_{major}{minor}{suffix}"


def package_version(name: str) -> str:
    """Installed version without a local tag (``2.11.0+cu130`` → ``2.11.0``), or ``none``."""
    try:
        return metadata.version(name).split("+", 1)[0]
    except metadata.PackageNotFoundError:
        return NONE


def python_version() -> str:
    return ".".join(platform.python_version_tuple()[:2])


def cpu_arch() -> str:
    return platform.machine()


_NVRM = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)")


def driver_version(proc: Path = Path("/proc/driver/nvidia/version")) -> str:
    """The NVIDIA driver version, from the kernel module or NVML; ``none`` without a GPU."""
    try:
        m = _NVRM.search(proc.read_text())
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
    return torch.cuda.get_device_name(0), arch_for_capability(major, minor), cuda
