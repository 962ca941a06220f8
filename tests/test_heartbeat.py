"""The test log's heartbeat (tests/support/heartbeat.py): a line naming the test, its phase and
the fixture at work once a step has been silent for the set time, and none while pytest talks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.support.clock import Clock
from tests.support.heartbeat import Fixture, Heartbeat, first_sentence


def test_a_line_comes_only_after_the_set_silence_and_names_the_fixture_at_work() -> None:
    clock = Clock(100.0)
    beat = Heartbeat(60, clock=clock)
    assert beat.due() is None  # no test running
    beat.phase("tests/t.py::test_x", "setup")
    beat.fixture_started(Fixture(name="vllm_image", doc="tiny-llama, built and pushed."))
    clock.now += 59
    assert beat.due() is None
    clock.now += 1
    assert beat.due() == (
        "kernelbake tests: 1 min 0 s in setup of tests/t.py::test_x, "
        "fixture vllm_image: tiny-llama, built and pushed."
    )
    # The next one a whole interval later, counting the phase's time from its start.
    clock.now += 30
    assert beat.due() is None
    clock.now += 30
    assert beat.due() == (
        "kernelbake tests: 2 min 0 s in setup of tests/t.py::test_x, "
        "fixture vllm_image: tiny-llama, built and pushed."
    )
    beat.fixture_finished("vllm_image")
    beat.phase("tests/t.py::test_x", "call")
    clock.now += 75
    assert beat.due() == "kernelbake tests: 1 min 15 s in call of tests/t.py::test_x"
    beat.idle()
    clock.now += 600
    assert beat.due() is None


def test_a_docstrings_first_sentence_on_one_line() -> None:
    assert (
        first_sentence("""tiny-llama built in one build
    and pushed. More here.

    Details.""")
        == "tiny-llama built in one build and pushed."
    )
    assert first_sentence("``127.0.0.1:<port>`` of a registry") == "``127.0.0.1:<port>`` of a registry"
    assert first_sentence(None) == ""


SLOW = '''
import time
import pytest

@pytest.fixture(scope="session")
def slow_build():
    """Builds once for the session. Not this."""
    time.sleep(1.5)

@pytest.fixture
def slow_thing(slow_build):
    """Sleeps, as a build would. Not this."""
    time.sleep(1.5)

def test_slow(slow_thing):
    print("captured, not shown")
    time.sleep(1.5)
'''


def test_a_silent_fixture_and_test_are_named_in_the_log_past_pytests_capture(tmp_path: Path) -> None:
    # Laid out as here: the suite's conftest in the tests' directory, below the rootdir.
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "tests" / "test_slow.py").write_text(SLOW)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--rootdir", str(tmp_path), "--heartbeat=0.5", "-p", "no:cacheprovider",
         str(tmp_path / "tests" / "test_slow.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(
        ln.startswith("kernelbake tests: ")
        and " in setup of tests/test_slow.py::test_slow, fixture slow_thing: Sleeps, as a build would." in ln
        for ln in lines
    ), done.stdout
    # A session fixture's setup runs on the session node, above the conftest's directory.
    assert any(
        ln.startswith("kernelbake tests: ")
        and ln.endswith(", fixture slow_build: Builds once for the session.")
        for ln in lines
    ), done.stdout
    assert any(
        ln.startswith("kernelbake tests: ") and " in call of tests/test_slow.py::test_slow" in ln
        for ln in lines
    )
    assert "captured, not shown" not in done.stdout
