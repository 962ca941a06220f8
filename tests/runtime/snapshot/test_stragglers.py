"""The restored tree after its root ended: what is left of it below serve is ended (SIGTERM,
then SIGKILL after the grace) and reaped; a snapshot pid held by a process not below serve is
never signalled."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelbake.runtime.snapshot import restore

_DEAF = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
)
_SLEEPER = "import time; print(1, flush=True); time.sleep(60)"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    """Children that said they are up; whatever is left of them is killed and waited for."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if Path(f"/proc/{proc.pid}").exists():
            proc.kill()
            proc.wait()
        # One reaped by the code under test: Popen must not wait for it (or warn of it).
        proc.returncode = 0 if proc.returncode is None else proc.returncode
        if proc.stdout is not None:
            proc.stdout.close()


def _start(procs: list[subprocess.Popen[str]], code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    procs.append(proc)
    assert proc.stdout is not None and proc.stdout.readline() == "1\n"
    return proc


def test_one_deaf_to_sigterm_is_killed_after_the_grace_and_reaped(
    started: list[subprocess.Popen[str]],
) -> None:
    deaf, polite = _start(started, _DEAF), _start(started, _SLEEPER)
    t = time.monotonic()
    assert restore._end_stragglers([deaf.pid, polite.pid], grace_s=0.5) == [deaf.pid, polite.pid]
    assert time.monotonic() - t >= 0.5
    assert not Path(f"/proc/{deaf.pid}").exists() and not Path(f"/proc/{polite.pid}").exists()


def test_after_the_root_only_snapshot_pids_below_serve_are_ended(
    started: list[subprocess.Popen[str]],
) -> None:
    # _supervise passes signals on to the root: pytest's own handlers are put back afterwards.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    root = _start(started, "import sys; print(1, flush=True); sys.exit(3)")
    member, bystander = _start(started, _SLEEPER), _start(started, _SLEEPER)
    try:
        # pid 1 is a snapshot pid held by a process not below this one: left alone.
        assert restore._supervise(root.pid, [root.pid, member.pid, 1]) == 3
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert not Path(f"/proc/{member.pid}").exists()
    assert bystander.poll() is None
