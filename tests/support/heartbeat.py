"""A line in the test log when a step has said nothing for a while (issue 44: `make test` was
silent for up to 170 s at a time while a fixture built an image or a runbook served a replica).

pytest prints a test's name or dot only when the test ends, and captures what fixtures and tests
print. The heartbeat watches which test is in which phase and which fixture is being set up, and
when nothing new has been said for ``every`` seconds it writes one line naming them, with the
fixture's own docstring (what it is doing), e.g.

    kernelbake tests: 2 min 0 s in setup of tests/integration/test_runbooks.py::test_x[README.md],
    fixture vllm_image: tiny-llama on vLLM's CPU build (the `make image` default), built and pushed.

``tests/conftest.py`` registers ``HeartbeatPlugin`` (``--heartbeat=SECONDS``, 0 turns it off)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass

import pytest


@dataclass(frozen=True, kw_only=True)
class Fixture:
    name: str
    doc: str  # the docstring's first sentence, or ""

    def describe(self) -> str:
        return f"fixture {self.name}: {self.doc}" if self.doc else f"fixture {self.name}"


def first_sentence(doc: str | None) -> str:
    """A docstring's first sentence on one line (up to the first blank line or '. ')."""
    text = " ".join((doc or "").strip().split("\n\n", 1)[0].split())
    head, dot, _ = text.partition(". ")
    return head + "." if dot else text


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


class Heartbeat:
    """Thread-safe state of what the session is doing; ``due`` says the line to write, if any.
    ``clock`` is there for tests."""

    def __init__(self, every: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._every = every
        self._clock = clock
        self._lock = threading.Lock()
        self._nodeid = ""
        self._phase = ""
        self._phase_since = 0.0
        self._said = 0.0
        self._fixtures: list[Fixture] = []

    def phase(self, nodeid: str, phase: str) -> None:
        """A test's setup, call or teardown begins: pytest has just said something, or will."""
        with self._lock:
            self._nodeid, self._phase = nodeid, phase
            self._phase_since = self._said = self._clock()

    def idle(self) -> None:
        with self._lock:
            self._nodeid, self._phase = "", ""
            self._said = self._clock()

    def fixture_started(self, fixture: Fixture) -> None:
        with self._lock:
            self._fixtures.append(fixture)

    def fixture_finished(self, name: str) -> None:
        with self._lock:
            for i in range(len(self._fixtures) - 1, -1, -1):
                if self._fixtures[i].name == name:
                    del self._fixtures[i]
                    break

    def due(self) -> str | None:
        """The line to write now, when ``every`` seconds passed since the last one (or since the
        phase began) and a test is in a phase; None otherwise."""
        with self._lock:
            now = self._clock()
            if not self._phase or now - self._said < self._every:
                return None
            self._said = now
            where = f"{_duration(now - self._phase_since)} in {self._phase} of {self._nodeid}"
            doing = f", {self._fixtures[-1].describe()}" if self._fixtures else ""
            return f"kernelbake tests: {where}{doing}"


class Beater:
    """The thread that writes ``heartbeat.due()`` through ``write`` while the session runs."""

    def __init__(self, heartbeat: Heartbeat, write: Callable[[str], None], *, poll: float = 5.0) -> None:
        self._heartbeat = heartbeat
        self._write = write
        self._poll = poll
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kernelbake-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._poll + 5)

    def _loop(self) -> None:
        while not self._stop.wait(self._poll):
            line = self._heartbeat.due()
            if line is not None:
                self._write(line)


class HeartbeatPlugin:
    """The pytest hooks that keep a ``Heartbeat`` up to date and a ``Beater`` writing its lines."""

    def __init__(self, every: float) -> None:
        self.heartbeat = Heartbeat(every)
        self._every = every
        self._beater: Beater | None = None

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # The lines go to the real stdout while a test runs, past pytest's capture of fd 1: a
        # copy of it, taken while capture is suspended.
        capman = session.config.pluginmanager.getplugin("capturemanager")
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            fd = os.dup(1)
        self._beater = Beater(
            self.heartbeat, lambda line: os.write(fd, f"\n{line}\n".encode()), poll=min(5.0, self._every / 4)
        )
        self._beater.start()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self._beater is not None:
            self._beater.stop()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.heartbeat.phase(item.nodeid, "setup")

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        self.heartbeat.phase(item.nodeid, "call")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None]:
        self.heartbeat.phase(item.nodeid, "teardown")
        try:
            yield
        finally:
            # Between tests pytest is the one talking (the next test's setup says nothing new).
            self.heartbeat.idle()

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        self.heartbeat.fixture_started(
            Fixture(name=fixturedef.argname, doc=first_sentence(fixturedef.func.__doc__))
        )
        try:
            return (yield)
        finally:
            self.heartbeat.fixture_finished(fixturedef.argname)
