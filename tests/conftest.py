from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import registry as test_registries
from tests.support.docker import local_names
from tests.support.heartbeat import Beater, Fixture, Heartbeat, first_sentence
from tests.support.registry import running_registry

# Hypothesis's per-example deadline (200 ms) measures the machine, not the code: CI runs on two
# shared cores, where a busy moment fails an unrelated property test. Properties are about
# values; where time is the property (reference parsing), the test bounds it itself.
settings.register_profile("kernelbake", deadline=None)
settings.load_profile("kernelbake")

REPO = Path(__file__).resolve().parents[1]

# Fixtures that need a tool, and the marker saying so. `make test-fast` deselects by marker, so
# a test using one of these unmarked would fail there instead of being left to `make test`.
NEEDS_MARKER = {
    "registry": "registry",
    "sigstore_mock": "sigstore",
    "cosign2": "cosign",
    "cosign3": "cosign",
    "single_image": "docker",
    "two_phase_image": "docker",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--heartbeat",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="a line naming the test and fixture at work after SECONDS without output (0: never)",
    )


# What the session is doing, for the heartbeat's lines (tests/support/heartbeat.py).
HEARTBEAT = pytest.StashKey[Heartbeat]()
BEATER = pytest.StashKey[Beater]()


def pytest_sessionstart(session: pytest.Session) -> None:
    every = session.config.getoption("--heartbeat")
    if not every:
        return
    # The lines go to the real stdout while a test runs, past pytest's capture of fd 1: a copy of
    # it, taken while capture is suspended.
    capman = session.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        fd = os.dup(1)
    heartbeat = Heartbeat(every)
    beater = Beater(heartbeat, lambda line: os.write(fd, f"\n{line}\n".encode()), poll=min(5.0, every / 4))
    session.config.stash[HEARTBEAT] = heartbeat
    session.config.stash[BEATER] = beater
    beater.start()


def _phase(item: pytest.Item, phase: str) -> None:
    if (heartbeat := item.config.stash.get(HEARTBEAT, None)) is not None:
        heartbeat.phase(item.nodeid, phase)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _phase(item, "setup")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    _phase(item, "call")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None]:
    _phase(item, "teardown")
    try:
        yield
    finally:
        # Between tests pytest is the one talking (the next test's setup says nothing new).
        if (heartbeat := item.config.stash.get(HEARTBEAT, None)) is not None:
            heartbeat.idle()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    heartbeat = request.config.stash.get(HEARTBEAT, None)
    if heartbeat is None:
        return (yield)
    heartbeat.fixture_started(Fixture(name=fixturedef.argname, doc=first_sentence(fixturedef.func.__doc__)))
    try:
        return (yield)
    finally:
        heartbeat.fixture_finished(fixturedef.argname)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unmarked = []
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        # A parameter that happens to share a fixture's name is not the fixture.
        used -= set(getattr(getattr(item, "callspec", None), "params", {}))
        unmarked += [
            f"{item.nodeid} uses the {fixture} fixture but is not marked {marker}"
            for fixture, marker in NEEDS_MARKER.items()
            if fixture in used and item.get_closest_marker(marker) is None
        ]
    if unmarked:
        raise pytest.UsageError("; ".join(unmarked))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture's teardown: a Docker name left under an address a test registry
    listened on points at a registry that is gone; say which, so the fixture that made it
    can be fixed (each registry's teardown removes them, tests/support/registry.py)."""
    if (beater := session.config.stash.get(BEATER, None)) is not None:
        beater.stop()
    left = [name for addr in dict.fromkeys(test_registries.STARTED) for name in local_names(f"{addr}/")]
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = f"kernelbake tests left {len(left)} Docker names under their gone registries: {' '.join(left)}"
        if reporter is not None:
            reporter.write_line(text, yellow=True)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``127.0.0.1:<port>`` of a real docker-registry for this test session."""
    with running_registry(tmp_path_factory.mktemp("registry")) as addr:
        yield addr
