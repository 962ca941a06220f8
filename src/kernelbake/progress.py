"""What a multi-target build shows while it runs: one line per target (stage, elapsed, log),
redrawn in place on a terminal, plain lines otherwise; and the table at the end."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import TextIO


@dataclasses.dataclass
class _Row:
    name: str
    stage: str = "queued"
    log: str = ""
    started: float | None = None
    finished: float | None = None
    result: str = ""
    detail: str = ""

    def elapsed(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or now) - self.started


class Progress:
    """Thread-safe: each target's build thread reports to it."""

    def __init__(self, names: Sequence[str], stream: TextIO, *, live: bool | None = None) -> None:
        self._rows = {n: _Row(n) for n in names}
        self._stream = stream
        self._live = stream.isatty() if live is None else live
        self._lock = threading.Lock()
        self._drawn = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = max((len(n) for n in names), default=0)

    def __enter__(self) -> Progress:
        if self._live:
            self._thread = threading.Thread(target=self._redraw_loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._draw()

    def stage(self, name: str, stage: str, log: str) -> None:
        with self._lock:
            row = self._rows[name]
            row.stage, row.log = stage, log
            if row.started is None:
                row.started = time.monotonic()
            if not self._live:
                self._line(f"kernelbake build: {name}: stage {stage} (log {log})")

    def done(self, name: str, result: str, detail: str) -> None:
        with self._lock:
            row = self._rows[name]
            row.finished = time.monotonic()
            if row.started is None:
                row.started = row.finished
            row.result, row.detail = result, detail
            if not self._live:
                self._line(
                    f"kernelbake build: {name}: {result} after {row.elapsed(row.finished):.0f}s ({detail})"
                )

    def summary(self) -> str:
        now = time.monotonic()
        w = max(self._width, len("target"))
        lines = [f"{'target':<{w}}  {'result':<7}  {'time':>6}  detail"]
        for row in self._rows.values():
            lines.append(
                f"{row.name:<{w}}  {row.result or 'skipped':<7}  {row.elapsed(now):>5.0f}s  {row.detail}"
            )
        return "\n".join(lines)

    def _line(self, text: str) -> None:
        self._stream.write(text + "\n")
        self._stream.flush()

    def _redraw_loop(self) -> None:
        while not self._stop.wait(1.0):
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            now = time.monotonic()
            out = [f"\x1b[{self._drawn}F"] if self._drawn else []
            for row in self._rows.values():
                state = row.result or row.stage
                out.append(
                    f"\x1b[2K{row.name:<{self._width}}  {state:<8} {row.elapsed(now):>5.0f}s  {row.log}\n"
                )
            self._stream.write("".join(out))
            self._stream.flush()
            self._drawn = len(self._rows)
