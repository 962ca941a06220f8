from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import registry as test_registries
from tests.support.docker import local_names
from tests.support.heartbeat import HeartbeatPlugin
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


def pytest_configure(config: pytest.Config) -> None:
    # A plugin, not this conftest's hooks: those reach only nodes under tests/, and a session
    # fixture's setup (the image builds) runs on the session node, above it.
    if every := config.getoption("--heartbeat"):
        config.pluginmanager.register(HeartbeatPlugin(every), "kernelbake-heartbeat")


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
