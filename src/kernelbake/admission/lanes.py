"""Verification threads shared between registries, each registry with its own share.

One pool of ``total`` threads; one lane per registry (``host[:port]``) that may use at most
``per_lane`` of them at once and keep at most ``queue`` jobs waiting. A registry that is slow or
flooded with new digests fills its own lane and its own queue, never the others'. Lanes with
waiting jobs take turns when a thread frees up, so one lane's backlog cannot starve another.

Jobs are ``concurrent.futures.Future``s that follow the executor protocol: cancelling one that
has not started removes it from its queue (nobody waits for it any more); once it has started it
runs to the end, holding only its own lane's share.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Generic, TypeVar

_T = TypeVar("_T")


class Saturated(Exception):
    """The lane's queue is full: the job was not queued."""

    def __init__(self, lane: str, queued: int) -> None:
        super().__init__(f"{lane}: {queued} jobs queued")
        self.lane = lane
        self.queued = queued


@dataclasses.dataclass(frozen=True, eq=False)
class _Job(Generic[_T]):
    lane: str
    call: Callable[[], _T]
    future: concurrent.futures.Future[_T]


class Lanes(Generic[_T]):
    def __init__(self, total: int, per_lane: int, queue: int, *, thread_name_prefix: str = "kb-lane") -> None:
        if total < 1 or per_lane < 1 or queue < 0:
            raise ValueError(f"total {total} and per_lane {per_lane} must be >= 1, queue {queue} >= 0")
        self.total, self.per_lane, self.queue = total, min(per_lane, total), queue
        # Jobs handed to the threads; never more at once than there are threads. Daemon
        # threads: a verification stuck on a dripping registry must not hold up the exit
        # (concurrent.futures joins its threads at exit).
        self._ready: SimpleQueue[_Job[_T] | None] = SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._prefix = thread_name_prefix
        self._running: collections.Counter[str] = collections.Counter()
        self._waiting: dict[str, collections.deque[_Job[_T]]] = {}
        # Lanes with waiting jobs, in the order they get the next free thread.
        self._turns: collections.deque[str] = collections.deque()
        self._jobs: dict[concurrent.futures.Future[_T], _Job[_T]] = {}
        self._active = 0
        self._closed = False
        self._lock = threading.Lock()

    def submit(self, lane: str, call: Callable[[], _T]) -> concurrent.futures.Future[_T]:
        """Start ``call`` now if the lane and the pool have room, else queue it; raises
        ``Saturated`` when the lane's queue is full and ``RuntimeError`` after ``shutdown``."""
        job = _Job(lane, call, concurrent.futures.Future())
        with self._lock:
            if self._closed:
                raise RuntimeError("lanes are shut down")
            if self._active < self.total and self._running[lane] < self.per_lane:
                job.future.set_running_or_notify_cancel()
                self._start(job)
                return job.future
            waiting = self._waiting.setdefault(lane, collections.deque())
            if len(waiting) >= self.queue:
                if not waiting:
                    del self._waiting[lane]
                raise Saturated(lane, len(waiting))
            if not waiting:
                self._turns.append(lane)
            waiting.append(job)
            self._jobs[job.future] = job
        return job.future

    def cancel(self, future: concurrent.futures.Future[_T]) -> bool:
        """Drop a job that has not started; False if it is running or done."""
        with self._lock:
            job = self._jobs.pop(future, None)
            if job is None:
                return False
            waiting = self._waiting[job.lane]
            waiting.remove(job)
            if not waiting:
                del self._waiting[job.lane]
                self._turns.remove(job.lane)
        # Out of the queue, nothing else can start it; its callbacks run outside the lock.
        return future.cancel()

    def running(self, lane: str) -> int:
        with self._lock:
            return self._running[lane]

    def queued(self, lane: str) -> int:
        with self._lock:
            return len(self._waiting.get(lane, ()))

    def shutdown(self) -> None:
        """Drop every queued job (cancelled) and stop taking new ones; running jobs finish."""
        with self._lock:
            self._closed = True
            dropped = list(self._jobs)
            self._jobs.clear()
            self._waiting.clear()
            self._turns.clear()
        for future in dropped:
            future.cancel()
        for _ in self._threads:
            self._ready.put(None)

    def _start(self, job: _Job[_T]) -> None:
        # Under the lock.
        self._running[job.lane] += 1
        self._active += 1
        if len(self._threads) < min(self._active, self.total):
            # Threads start as they are first needed, and stay.
            thread = threading.Thread(
                target=self._thread, name=f"{self._prefix}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        self._ready.put(job)

    def _thread(self) -> None:
        while (job := self._ready.get()) is not None:
            self._work(job)

    def _work(self, job: _Job[_T]) -> None:
        # The share is given back before the future is done, so whoever sees the result
        # also sees the room it left.
        try:
            result = job.call()
        except BaseException as exc:
            self._finished(job.lane)
            job.future.set_exception(exc)
        else:
            self._finished(job.lane)
            job.future.set_result(result)

    def _finished(self, lane: str) -> None:
        with self._lock:
            self._running[lane] -= 1
            if not self._running[lane]:
                del self._running[lane]
            self._active -= 1
            self._next()

    def _next(self) -> None:
        """Hand free threads to waiting lanes in turn (under the lock)."""
        for _ in range(len(self._turns)):
            if self._active >= self.total or self._closed:
                return
            lane = self._turns[0]
            self._turns.rotate(-1)
            if self._running[lane] >= self.per_lane:
                continue
            waiting = self._waiting[lane]
            job = waiting.popleft()
            del self._jobs[job.future]
            if not waiting:
                del self._waiting[lane]
                self._turns.remove(lane)
            # Pending futures only live in the queue and cancel() removes them from it first,
            # so this always moves the job to running.
            job.future.set_running_or_notify_cancel()
            self._start(job)
