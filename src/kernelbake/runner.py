"""The one place kernelbake starts subprocesses. Echoes ``+ cmd`` like ``set -x``; injectable.

Tests pass a recorder instead of ``run``; nothing else in the package calls ``subprocess``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

from kernelbake.errors import EnvironmentProblem


@dataclasses.dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    returncode: int
    stdout: str = ""
    stderr: str = ""


class Runner(Protocol):
    def __call__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        capture: bool = False,
        log: Path | None = None,
        input: str | None = None,
        timeout: float | None = None,
        on_line: Callable[[str], None] | None = None,
        forward_signals: bool = False,
    ) -> Result: ...


@contextlib.contextmanager
def _forwarding(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> Iterator[None]:
    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class TimedOut(EnvironmentProblem):
    """``run`` ended a command that ran past its ``timeout`` (it was killed)."""


def format_cmd(argv: Sequence[str]) -> str:
    return "+ " + " ".join(shlex.quote(a) for a in argv)


def _not_found(argv: Sequence[str]) -> EnvironmentProblem:
    """What ``run`` and ``spawn`` raise when ``argv[0]`` is not there to start."""
    return EnvironmentProblem(f"{argv[0]}: command not found", hint="install it or put it on PATH")


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    capture: bool = False,
    log: Path | None = None,
    input: str | None = None,
    timeout: float | None = None,
    echo: IO[str] | None = None,
    on_line: Callable[[str], None] | None = None,
    forward_signals: bool = False,
    redact: Callable[[str], str] | None = None,
    hide: Callable[[str], bool] | None = None,
) -> Result:
    """Run ``argv``; never raises on a non-zero exit (callers decide what a failure means).

    With ``log``, output streams to the terminal and to the file, so a failed build can be
    pointed at by path. With ``on_line``, each line of output is also handed to it as it
    comes (``serve`` reads the engine's own cache evidence this way). ``forward_signals``
    passes SIGTERM/SIGINT/SIGHUP on to the child, for a supervisor standing in for it as a
    container's main process. ``env`` is the complete environment, built by the caller.
    ``redact`` rewrites the echoed command and each line of output read through kernelbake
    (with ``log`` or ``on_line``; secret values → digests). ``hide`` keeps lines meant for
    ``on_line`` alone (machine-readable ones) off the terminal; the log still has them.
    """
    shown = redact or (lambda text: text)
    print(shown(format_cmd(argv)), file=echo or sys.stderr, flush=True)
    try:
        if capture:
            cp = subprocess.run(
                list(argv), env=env, cwd=cwd, input=input, capture_output=True, text=True, timeout=timeout
            )
            return Result(tuple(argv), cp.returncode, cp.stdout, cp.stderr)
        if log is None and on_line is None and not forward_signals:
            cp = subprocess.run(list(argv), env=env, cwd=cwd, input=input, text=True, timeout=timeout)
            return Result(tuple(argv), cp.returncode)
        if log is None and on_line is None and input is None:
            # Supervised without reading its output: the child keeps our stdout and stderr.
            with subprocess.Popen(list(argv), env=env, cwd=cwd) as child, _forwarding(child):
                return Result(tuple(argv), child.wait(timeout=timeout))
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
        with (
            log.open("w") if log is not None else contextlib.nullcontext() as fh,
            subprocess.Popen(
                list(argv),
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            ) as proc,
            _forwarding(proc) if forward_signals else contextlib.nullcontext(),
        ):
            if input is not None and proc.stdin:
                proc.stdin.write(input)
                proc.stdin.close()
            assert proc.stdout is not None
            for line in proc.stdout:
                if hide is None or not hide(line):
                    sys.stderr.write(shown(line))
                if fh is not None:
                    fh.write(shown(line))
                if on_line is not None:
                    on_line(line)
            rc = proc.wait(timeout=timeout)
        return Result(tuple(argv), rc)
    except FileNotFoundError:
        raise _not_found(argv) from None
    except subprocess.TimeoutExpired:
        raise TimedOut(f"{format_cmd(argv)[2:]}: timed out after {timeout:.0f}s") from None


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    output: Path,
    preexec: Callable[[], None] | None = None,
    echo: IO[str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session of its own, stdin from /dev/null and stdout and stderr to
    the file ``output``, and return at once (``kernelbake snapshot take``: the tree it dumps
    must hold no pipe to a process outside it, which CRIU could not restore elsewhere)."""
    print(format_cmd(argv), file=echo or sys.stderr, flush=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        with output.open("ab") as fh:
            return subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
    except FileNotFoundError:
        raise _not_found(argv) from None
