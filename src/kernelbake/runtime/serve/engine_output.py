"""Where an engine asked in this process writes (``kernelbake check`` runs vLLM's own parser,
config builder and, on the CPU build, a trace): its log lines, its libraries' warnings and its
children's output go to a log file, so that what ``check`` prints is its verdict; with ``-v``
they go to stderr as before. Either way the last lines it wrote are kept, so that an engine
that rejects the arguments is quoted in its own words."""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kernelbake.runtime.redact import Redactor

_KEPT = 50


class Heard:
    """A text stream that writes through ``redact`` to ``target`` and keeps the last lines."""

    def __init__(self, target: Any, redact: Redactor) -> None:
        self._target = target
        self._redact = redact
        self._lines: collections.deque[str] = collections.deque(maxlen=_KEPT)
        self._partial = ""

    def write(self, text: str) -> int:
        shown = self._redact(text)
        # ValueError: the log file is closed, and a logger that kept this stream still writes.
        with contextlib.suppress(ValueError):
            self._target.write(shown)
        *done, self._partial = (self._partial + shown).split("\n")
        self._lines.extend(done)
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def lines(self) -> list[str]:
        return [*self._lines, *([self._partial] if self._partial else [])]

    def rejection(self) -> str | None:
        """What the engine said as it exited: its argument parser's ``prog: error: …`` line
        (argparse's way of rejecting an argument), else the last line it wrote."""
        said = [ln.strip() for ln in self.lines() if ln.strip()]
        errors = [ln for ln in said if ": error: " in ln]
        found = errors or said
        return found[-1] if found else None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


@contextlib.contextmanager
def engine_output(log: Path | None, redact: Redactor) -> Iterator[Heard]:
    """While the engine runs here: with ``log``, file descriptors 1 and 2 (C++ warnings, child
    processes) and Python's ``sys.stdout``/``sys.stderr`` (vLLM's logger) all append to it;
    without, the engine's stdout (descriptor 1 too) goes to stderr, since the command's stdout
    is its verdict.
    Output written below Python (the descriptors) is not redacted; vLLM echoes its arguments
    through its logger, which is."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = sys.stdout, sys.stderr
    if log is None:
        heard = Heard(sys.stderr, redact)
        out = os.dup(1)
        try:
            os.dup2(2, 1)
            sys.stdout = sys.stderr = heard
            yield heard
        finally:
            sys.stdout, sys.stderr = saved
            os.dup2(out, 1)
            os.close(out)
        return
    with log.open("a", buffering=1) as fh:
        heard = Heard(fh, redact)
        fds = os.dup(1), os.dup(2)
        try:
            os.dup2(fh.fileno(), 1)
            os.dup2(fh.fileno(), 2)
            sys.stdout = sys.stderr = heard
            yield heard
        finally:
            with contextlib.suppress(Exception):
                heard.flush()
            sys.stdout, sys.stderr = saved
            os.dup2(fds[0], 1)
            os.dup2(fds[1], 2)
            for fd in fds:
                os.close(fd)
