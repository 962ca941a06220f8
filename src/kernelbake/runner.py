"""The one place kernelbake starts subprocesses. Echoes ``+ cmd`` like ``set -x``; injectable.

Tests pass a recorder instead of ``run``; nothing else in the package calls ``subprocess``.
"""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
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
    ) -> Result: ...


def format_cmd(argv: Sequence[str]) -> str:
    return "+ " + " ".join(shlex.quote(a) for a in argv)


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
) -> Result:
    """Run ``argv``; never raises on a non-zero exit (callers decide what a failure means).

    With ``log``, output streams to the terminal and to the file, so a failed build can be
    pointed at by path. ``env`` is the complete environment, built by the caller.
    """
    print(format_cmd(argv), file=echo or sys.stderr, flush=True)
    try:
        if capture:
            cp = subprocess.run(
                list(argv), env=env, cwd=cwd, input=input, capture_output=True, text=True, timeout=timeout
            )
            return Result(tuple(argv), cp.returncode, cp.stdout, cp.stderr)
        if log is None:
            cp = subprocess.run(list(argv), env=env, cwd=cwd, input=input, text=True, timeout=timeout)
            return Result(tuple(argv), cp.returncode)
        log.parent.mkdir(parents=True, exist_ok=True)
        with (
            log.open("w") as fh,
            subprocess.Popen(
                list(argv),
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            ) as proc,
        ):
            if input is not None and proc.stdin:
                proc.stdin.write(input)
                proc.stdin.close()
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stderr.write(line)
                fh.write(line)
            rc = proc.wait(timeout=timeout)
        return Result(tuple(argv), rc)
    except FileNotFoundError:
        raise EnvironmentProblem(
            f"{argv[0]}: command not found", hint="install it or put it on PATH"
        ) from None
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"{format_cmd(argv)[2:]}: timed out after {timeout:.0f}s") from None
