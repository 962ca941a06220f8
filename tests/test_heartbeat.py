"""The test log's heartbeat (tests/support/heartbeat.py): a line naming the test, its phase and
the fixture at work once a step has been silent for the set time, and none while pytest talks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.support.heartbeat import Fixture, Heartbeat, first_sentence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_comes_only_after_the_set_silence_and_names_the_fixture_at_work() -> None:
    clock = Clock()
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

@pytest.fixture
def slow_thing():
    """Sleeps, as a build would. Not this."""
    time.sleep(2.5)

def test_slow(slow_thing):
    print("captured, not shown")
    time.sleep(2.5)
'''


def test_a_silent_fixture_and_test_are_named_in_the_log_past_pytests_capture(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text(SLOW)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "--heartbeat=1", "-p", "no:cacheprovider",
         str(tmp_path / "test_slow.py")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert any(
        ln.startswith("kernelbake tests: ")
        and " in setup of test_slow.py::test_slow, fixture slow_thing: Sleeps, as a build would." in ln
        for ln in lines
    ), done.stdout
    assert any(
        ln.startswith("kernelbake tests: ") and " in call of test_slow.py::test_slow" in ln for ln in lines
    )
    assert "captured, not shown" not in done.stdout
