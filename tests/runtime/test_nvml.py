"""NVML's device files, given up on take's request by a process the snapshot will hold: the
shutdowns counted against a stand-in library, and the handler on real processes (installed by
vLLM's plugin only where take asks, seen in /proc, surviving its signal)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelbake.runtime import nvml
from kernelbake.runtime.env import SNAPSHOT_TAKE_ENV
from kernelbake.runtime.snapshot import tree


class _Lib:
    """libnvidia-ml as far as shutdown goes: 0 (success) while initialised, else 1
    (NVML_ERROR_UNINITIALIZED); ``stuck`` answers 0 for ever."""

    def __init__(self, inits: int, *, stuck: bool = False) -> None:
        self.inits, self.stuck, self.calls = inits, stuck, 0

    def nvmlShutdown(self) -> int:
        self.calls += 1
        if self.stuck:
            return 0
        if self.inits == 0:
            return 1
        self.inits -= 1
        return 0


def test_nvml_is_shut_down_as_often_as_it_was_initialised() -> None:
    lib = _Lib(3)
    assert nvml.release(lambda: lib) == 3
    assert lib.inits == 0 and lib.calls == 4  # the fourth said "not initialised"


def test_a_process_that_never_loaded_nvml_has_nothing_to_release() -> None:
    assert nvml.release(lambda: None) == 0


def test_a_library_that_never_says_uninitialised_is_bounded() -> None:
    lib = _Lib(0, stuck=True)
    assert nvml.release(lambda: lib) == nvml._MOST == lib.calls


_CHILD = """
import sys, time
if sys.argv[1] == "plugin":
    from kernelbake.runtime.engines.vllm import plugin
    plugin.register()
print("ready", flush=True)
time.sleep(60)
"""


def _child(env_value: str | None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBAKE_")}
    if env_value is not None:
        env[SNAPSHOT_TAKE_ENV] = env_value
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, "plugin"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize(("env_value", "catches"), [("1", True), (None, False), ("0", False)])
def test_the_plugin_installs_the_handler_only_where_take_asks(env_value: str | None, catches: bool) -> None:
    proc = _child(env_value)
    try:
        assert tree.catches(proc.pid, nvml.RELEASE_SIGNAL) is catches
        # SIGTERM: Python installs no handler of its own for it.
        assert tree.catches(proc.pid, signal.SIGTERM) is False
    finally:
        proc.kill()
        proc.communicate()


def test_a_process_with_the_handler_survives_the_signal_and_says_what_it_did() -> None:
    proc = _child("1")
    try:
        os.kill(proc.pid, nvml.RELEASE_SIGNAL)
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        proc.kill()
        _out, err = proc.communicate()
    # This machine has no GPU: NVML was never loaded, so there was nothing to shut down.
    assert f"kernelbake: NVML shut down 0 times for the snapshot (pid {proc.pid})" in err


def test_catches_reads_the_sigcgt_mask(tmp_path: Path) -> None:
    (tmp_path / "5").mkdir()
    # Bits 1 (SIGINT, 2) and 14 (SIGTERM, 15) set.
    (tmp_path / "5/status").write_text("Name:\tpython3\nSigCgt:\t0000000000004002\n")
    assert tree.catches(5, signal.SIGINT, tmp_path) and tree.catches(5, signal.SIGTERM, tmp_path)
    assert not tree.catches(5, signal.SIGHUP, tmp_path)
    assert not tree.catches(6, signal.SIGINT, tmp_path)  # gone
