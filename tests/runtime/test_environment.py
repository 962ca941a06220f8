"""``serve`` refuses an environment that names one of its variables twice (issue 41, item 3).

A process's environment is a list (execve's ``envp``); ``os.environ`` is a dict built from it
keeping the *first* entry of a name, where Kubernetes keeps the last and a shell the last too.
So a check that read one end judged another value than the one the runtime reads. The real
block is made here with execve itself, and ``RuntimeEnv.from_env`` reads /proc/self/environ."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbake.errors import BadInput
from kernelbake.runtime import env as runtime_env
from kernelbake.runtime.env import RuntimeEnv

SRC = Path(__file__).resolve().parents[2] / "src"
FIRST = "sha256:" + "a" * 64
LAST = "sha256:" + "b" * 64

# execve with the given envp (ctypes: os.execve takes a mapping, which cannot repeat a name),
# into a Python that reads the runtime's environment and says what it got.
_EXEC = """
import ctypes, sys
envp = [e.encode() for e in sys.argv[1:]]
argv = [sys.executable.encode(), b"-c", sys.stdin.read().encode()]
arr = lambda xs: (ctypes.c_char_p * (len(xs) + 1))(*xs, None)
ctypes.CDLL(None, use_errno=True).execve(sys.executable.encode(), arr(argv), arr(envp))
raise OSError(ctypes.get_errno(), "execve failed")
"""
_READ = """
import os
from kernelbake.errors import BadInput
from kernelbake.runtime.env import RuntimeEnv
print("os.environ:", os.environ["KERNELBAKE_DELTA_DIGEST"])
try:
    print("read:", RuntimeEnv.from_env().delta_digest)
except BadInput as exc:
    print("refused:", exc)
"""


def _started_with(*envp: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _EXEC, f"PYTHONPATH={SRC}", f"PATH={os.environ.get('PATH', '')}", *envp],
        input=_READ,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


@pytest.mark.skipif(not runtime_env.ENVIRON_BLOCK.exists(), reason="needs Linux's /proc/self/environ")
def test_a_variable_set_twice_in_the_real_environment_is_refused() -> None:
    out = _started_with(f"KERNELBAKE_DELTA_DIGEST={FIRST}", "X=1", f"KERNELBAKE_DELTA_DIGEST={LAST}")
    # What a reader of the first entry and one of the last disagree on:
    assert f"os.environ: {FIRST}" in out
    assert "refused: the environment sets $KERNELBAKE_DELTA_DIGEST 2 times (/proc/self/environ)" in out
    once = _started_with(f"KERNELBAKE_DELTA_DIGEST={LAST}", "X=1", "X=2")
    assert f"read: {LAST}" in once, "a name the runtime does not read may repeat"


def test_the_block_is_read_only_for_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    block = b"KERNELBAKE_VERIFY=sha256\0KERNELBAKE_VERIFY=unsafe-size-only\0"
    monkeypatch.setattr(runtime_env, "_environ_block", lambda: block)
    with pytest.raises(BadInput, match=r"sets \$KERNELBAKE_VERIFY 2 times"):
        RuntimeEnv.from_env()
    # A mapping given by the caller (serve's engine environment, tests) is one value a name.
    assert RuntimeEnv.from_env({"KERNELBAKE_VERIFY": "sha256"}).verify.value == "sha256"


def test_an_unreadable_block_fails_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    def denied() -> bytes:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(runtime_env, "_environ_block", denied)
    with pytest.raises(BadInput, match=r"/proc/self/environ cannot be read \(Permission denied\)"):
        RuntimeEnv.from_env()
