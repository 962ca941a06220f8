"""What a multi-target build shows while it runs: one line per target (stage, elapsed, log),
redrawn in place on a terminal, plain lines otherwise; and the table at the end.

Without a terminal (``make image`` pipes through ``tee``), a watched command that goes quiet
(``docker push`` says nothing while a layer uploads, for minutes) gets a line every
``every`` seconds: how long it has run and, for a push, how many layers are up."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TextIO

# ``docker push`` without a terminal: one line per change of a layer's state, no byte counts.
_LAYER = re.compile(r"^([0-9a-f]{12}): (.+)$")
_LAYER_UP = ("Pushed", "Layer already exists", "Mounted from ")


@dataclasses.dataclass
class _Row:
    name: str
    stage: str = "queued"
    log: str = ""
    started: float | None = None
    finished: float | None = None
    result: str = ""
    detail: str = ""
    # What the stage's command has said of its progress ("3/7 layers"), and when kernelbake
    # last heard it or said a line of it (quiet_since); None: not watched.
    note: str = ""
    quiet_since: float | None = None
    stage_started: float = 0.0

    def elapsed(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.finished or now) - self.started


class PushTally:
    """The layers ``docker push`` names and those it reports up (pushed, already there, or
    mounted from another repository), read from its own lines as they come."""

    def __init__(self) -> None:
        self._layers: dict[str, bool] = {}

    def __call__(self, line: str) -> str | None:
        """The note for this line ("3/7 layers"), or None when it names no layer."""
        m = _LAYER.match(line.strip())
        if m is None:
            return None
        layer, state = m.groups()
        self._layers[layer] = self._layers.get(layer, False) or state.startswith(_LAYER_UP)
        return f"{sum(self._layers.values())}/{len(self._layers)} layers"


class Progress:
    """Thread-safe: each target's build thread reports to it. ``clock`` and ``every`` (seconds
    of quiet before a watched stage gets a line) are there for tests."""

    def __init__(
        self,
        names: Sequence[str],
        stream: TextIO,
        *,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        every: float = 15.0,
    ) -> None:
        self._rows = {n: _Row(n) for n in names}
        self._stream = stream
        self._live = stream.isatty() if live is None else live
        self._clock = clock
        self._every = every
        self._lock = threading.Lock()
        self._drawn = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._width = max((len(n) for n in names), default=0)

    def __enter__(self) -> Progress:
        self._thread = threading.Thread(target=self._redraw_loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self._live:
                self._draw()

    def stage(self, name: str, stage: str, log: str) -> None:
        with self._lock:
            row = self._rows[name]
            row.stage, row.log = stage, log
            row.note, row.quiet_since = "", None
            row.stage_started = self._clock()
            if row.started is None:
                row.started = row.stage_started
            if not self._live:
                self._line(f"kernelbake build: {name}: stage {stage} (log {log})")

    def done(self, name: str, result: str, detail: str) -> None:
        with self._lock:
            row = self._rows[name]
            row.finished = self._clock()
            row.quiet_since = None
            if row.started is None:
                row.started = row.finished
            row.result, row.detail = result, detail
            if not self._live:
                self._line(
                    f"kernelbake build: {name}: {result} after {row.elapsed(row.finished):.0f}s ({detail})"
                )

    def watch(self, name: str, tally: Callable[[str], str | None] | None = None) -> Callable[[str], None]:
        """An ``on_line`` for the command of ``name``'s current stage: each line it prints marks
        it heard, and ``tally`` turns a line into the stage's note (``PushTally``)."""
        with self._lock:
            self._rows[name].quiet_since = self._clock()

        def heard(line: str) -> None:
            note = tally(line) if tally is not None else None
            with self._lock:
                row = self._rows[name]
                if row.quiet_since is not None:
                    row.quiet_since = self._clock()
                if note is not None:
                    row.note = note

        return heard

    def tick(self) -> None:
        """Without a terminal: a line for each watched stage that has been quiet ``every``
        seconds, then again every ``every`` seconds while it stays quiet."""
        if self._live:
            return
        with self._lock:
            now = self._clock()
            for row in self._rows.values():
                if row.quiet_since is None or row.finished is not None or now - row.quiet_since < self._every:
                    continue
                row.quiet_since = now
                note = f"{row.note}, " if row.note else ""
                self._line(
                    f"kernelbake build: {row.name}: {row.stage}: {note}{now - row.stage_started:.0f} s (log {row.log})"
                )

    def summary(self) -> str:
        now = self._clock()
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
            if self._live:
                self._draw()
            else:
                self.tick()

    def _draw(self) -> None:
        with self._lock:
            now = self._clock()
            out = [f"\x1b[{self._drawn}F"] if self._drawn else []
            for row in self._rows.values():
                state = row.result or row.stage
                note = f"{row.note}  " if row.note and not row.result else ""
                out.append(
                    f"\x1b[2K{row.name:<{self._width}}  {state:<8} {row.elapsed(now):>5.0f}s  {note}{row.log}\n"
                )
            self._stream.write("".join(out))
            self._stream.flush()
            self._drawn = len(self._rows)
