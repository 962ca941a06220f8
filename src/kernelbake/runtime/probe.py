"""Small probes of the running system, shared by engines; tests monkeypatch them."""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import sys
from pathlib import Path

from kernelbake.contract.key import NONE
from kernelbake.contract.platform import arch_for
from kernelbake.errors import EnvironmentProblem
from kernelbake.runner import Runner, run

_NVIDIA_VERSION = Path("/proc/driver/nvidia/version")
# torch's import and CUDA's initialisation take seconds; a hung driver is not waited on forever.
GPU_QUERY_TIMEOUT_S = 120
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


def torch_cuda() -> str:
    """The CUDA version torch was built with, or ``none``; no device is touched."""
    import torch

    return str(torch.version.cuda) if torch.version.cuda else NONE


def cuda_device(runner: Runner = run) -> tuple[str, str, str]:
    """(device name, arch, torch's CUDA version) of GPU 0, or ``none``s without one; asked of a
    child process (``kernelbake.runtime.gpu_query``). serve's supervisor is the root of the
    process tree ``kernelbake snapshot take`` dumps, and CUDA's initialisation leaves a process
    holding the GPU's device files, which CRIU cannot dump; a process that only queried the GPU
    has no CUDA context for the driver's checkpoint to release them with (the driver refuses a
    process without one: CUresult 3 for serve's own on the H100; take checkpoints only the
    processes holding the GPU and names any left holding it). The child pays torch's import once
    more, while the engine starts."""
    r = runner(
        [sys.executable, "-m", "kernelbake.runtime.gpu_query"], capture=True, timeout=GPU_QUERY_TIMEOUT_S
    )
    lines = r.stdout.strip().splitlines()
    try:
        name, capability, cuda = json.loads(lines[-1])
        arch = NONE if name is None else arch_for((int(capability[0]), int(capability[1])))
    except (IndexError, ValueError, TypeError) as exc:
        said = (r.stderr.strip().splitlines() or [f"{type(exc).__name__}: {exc}"])[-1][:300]
        raise EnvironmentProblem(f"asking torch about GPU 0 failed (exit {r.returncode}): {said}") from None
    return (NONE if name is None else str(name)), arch, (str(cuda) if cuda else NONE)
