"""Small probes of the running system, shared by engines; tests monkeypatch them."""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from pathlib import Path

from kernelbake.key import NONE

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
    """The loaded NVIDIA kernel module's version, as the container sees it, or ``none``."""
    try:
        text = _NVIDIA_VERSION.read_text()
    except OSError:
        return NONE
    m = _KERNEL_MODULE.search(text)
    return m.group(1) if m else NONE


def gpu_arch(device_name: str, capability: tuple[int, int]) -> str:
    """The catalogue's arch for a known device (``sm_90a`` for Hopper), else ``sm_XY``."""
    from kernelbake.catalogue import load_catalogue

    gpu = load_catalogue().gpu_by_device_name(device_name)
    if gpu is not None:
        return gpu.arch
    return f"sm_{capability[0]}{capability[1]}"
