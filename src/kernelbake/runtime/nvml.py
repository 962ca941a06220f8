"""NVML's hold on the GPU, given up on request by a process a snapshot is about to hold.

The driver's checkpoint gives up the device files of a process's CUDA contexts, not those
NVML (libnvidia-ml) opened. ``torch.cuda.device_count()`` initialises NVML before CUDA is up
and never shuts it down (torch 2.13's ``_raw_device_count_nvml``), and NVML keeps
``/dev/nvidiactl``, ``/dev/nvidia0`` and the MIG capability files ``/dev/nvidia-caps/*`` open
until it has been shut down as often as it was initialised. On the H100, vLLM 0.32's engine
core held exactly those after the driver's checkpoint, and CRIU cannot dump a device file.

So ``snapshot take`` starts the engine with ``RELEASE_ENV`` set; vLLM's plugin then installs a
handler of ``RELEASE_SIGNAL`` in every process it starts, and take sends that signal to each
process still holding device files after the checkpoint (only to one whose ``SigCgt`` says it
catches it: a real-time signal's default action ends the process). NVML is initialised again
by its next caller (vLLM's ``with_nvml_context`` does on every query; torch caches the count
once CUDA is up), so the restored engine loses nothing. Imports nothing heavy: the plugin
imports it in every process vLLM starts."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

RELEASE_SIGNAL = signal.SIGRTMIN + 7
_LIBRARY = "libnvidia-ml.so.1"
# More shutdowns than any process initialises NVML (torch once per device count before CUDA
# is up, vLLM once per query it wraps): a bound, so that a library that never says
# NVML_ERROR_UNINITIALIZED cannot hold the handler forever.
_MOST = 4096


def _loaded() -> Any | None:
    """libnvidia-ml as this process already has it loaded, or None: never loaded here, since a
    process that never loaded it holds nothing of NVML's."""
    try:
        return ctypes.CDLL(_LIBRARY, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        return None


def release(load: Callable[[], Any | None] = _loaded) -> int:
    """NVML shut down until it says it is not initialised (``nvmlShutdown`` answers non-zero,
    NVML_ERROR_UNINITIALIZED): how many shutdowns that took. Its device files close with the
    last."""
    lib = load()
    if lib is None:
        return 0
    for done in range(_MOST):
        if lib.nvmlShutdown() != 0:
            return done
    return _MOST


def _on_signal(_signum: int, _frame: object) -> None:
    done = release()
    # In the engine's log, which take keeps with the snapshot: what the process did and when.
    print(
        f"kernelbake: NVML shut down {done} times for the snapshot (pid {os.getpid()})",
        file=sys.stderr,
        flush=True,
    )


def install() -> bool:
    """The handler, installed in this process: False where it cannot be (signal handlers are
    set from the main thread only), and take then finds the process does not catch it."""
    try:
        signal.signal(RELEASE_SIGNAL, _on_signal)
    except ValueError:
        return False
    return True
