"""Each lane (registry) gets its own share of the threads and its own bounded queue."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import pytest

from kernelbake.admission.lanes import Lanes, Saturated


class Held:
    """Jobs that block until released, recording which started."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)

    def job(self, name: str) -> Callable[[], str]:
        def run() -> str:
            with self._cv:
                self.started.append(name)
                self._cv.notify_all()
            self.release.wait(30)
            return name

        return run

    def wait_started(self, count: int) -> None:
        with self._cv:
            assert self._cv.wait_for(lambda: len(self.started) >= count, 30), self.started


@pytest.fixture
def held() -> Iterator[Held]:
    h = Held()
    yield h
    h.release.set()


def test_one_lane_cannot_take_more_than_its_share(held: Held) -> None:
    lanes: Lanes[str] = Lanes(total=4, per_lane=2, queue=10)
    slow = [lanes.submit("slow:5000", held.job(f"slow-{i}")) for i in range(5)]
    held.wait_started(2)
    assert (lanes.running("slow:5000"), lanes.queued("slow:5000")) == (2, 3)
    # Another registry runs at once, beside the two held jobs.
    assert lanes.submit("healthy", lambda: "ok").result(timeout=30) == "ok"
    assert sorted(held.started) == ["slow-0", "slow-1"]
    held.release.set()
    assert [f.result(timeout=30) for f in slow] == [f"slow-{i}" for i in range(5)]
    lanes.shutdown()


def test_a_full_queue_refuses_and_says_how_full(held: Held) -> None:
    lanes: Lanes[str] = Lanes(total=2, per_lane=1, queue=2)
    futures = [lanes.submit("r", held.job(str(i))) for i in range(3)]
    with pytest.raises(Saturated) as err:
        lanes.submit("r", held.job("refused"))
    assert (err.value.lane, err.value.queued) == ("r", 2)
    # Other lanes still have room in their own queue.
    other = lanes.submit("other", held.job("other"))
    held.release.set()
    assert [f.result(timeout=30) for f in [*futures, other]] == ["0", "1", "2", "other"]
    assert "refused" not in held.started
    lanes.shutdown()


def test_a_cancelled_queued_job_never_runs_and_frees_its_place(held: Held) -> None:
    lanes: Lanes[str] = Lanes(total=1, per_lane=1, queue=1)
    running = lanes.submit("r", held.job("running"))
    queued = lanes.submit("r", held.job("queued"))
    held.wait_started(1)
    assert not lanes.cancel(running), "a running job runs to the end"
    assert lanes.cancel(queued) and queued.cancelled()
    assert lanes.queued("r") == 0
    later = lanes.submit("r", held.job("later"))
    held.release.set()
    assert running.result(timeout=30) == "running" and later.result(timeout=30) == "later"
    assert held.started == ["running", "later"]
    lanes.shutdown()


def test_waiting_lanes_take_turns_for_free_threads(held: Held) -> None:
    lanes: Lanes[str] = Lanes(total=1, per_lane=1, queue=10)
    first = lanes.submit("a", held.job("a0"))
    held.wait_started(1)
    rest = [lanes.submit("a", held.job(f"a{i}")) for i in range(1, 4)]
    rest += [lanes.submit("b", held.job(f"b{i}")) for i in range(2)]
    held.release.set()
    for f in [first, *rest]:
        f.result(timeout=30)
    assert held.started == ["a0", "a1", "b0", "a2", "b1", "a3"]
    lanes.shutdown()


def test_errors_reach_the_future_and_free_the_thread() -> None:
    lanes: Lanes[str] = Lanes(total=1, per_lane=1, queue=0)

    def broken() -> str:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        lanes.submit("r", broken).result(timeout=30)
    assert lanes.submit("r", lambda: "next").result(timeout=30) == "next"
    lanes.shutdown()


def test_shutdown_drops_the_queue_and_refuses_new_jobs(held: Held) -> None:
    lanes: Lanes[str] = Lanes(total=1, per_lane=1, queue=5)
    running = lanes.submit("r", held.job("running"))
    queued = lanes.submit("r", held.job("queued"))
    held.wait_started(1)
    lanes.shutdown()
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        lanes.submit("r", held.job("late"))
    held.release.set()
    assert running.result(timeout=30) == "running"


def test_a_stuck_job_does_not_hold_up_the_exit() -> None:
    # A verification stuck on a dripping registry must not keep a stopping webhook alive.
    script = (
        "import threading\n"
        "from kernelbake.admission.lanes import Lanes\n"
        "lanes = Lanes(total=1, per_lane=1, queue=0)\n"
        "lanes.submit('r', threading.Event().wait)\n"
        "lanes.shutdown()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
