"""The bytes of large review bodies that the pod works on at once, shared by its workers (and,
in a budget of its own, of cache deltas' delta.json being read: ``admission.delta_reads``).

A review costs memory in proportion to its body: decoded, an 8 MiB pod spec of 137,000
containers is some 190 MiB of Python objects in the worker that plans it. The workers of one
pod share its memory limit (512 MiB in deploy/deployment.yaml), and the API server sends as many
reviews at once as it has requests, so without a bound three such reviews on each of two
workers took 900 MiB (bench/admission_adversarial.py). A body larger than ``server.INLINE_BODY``
is read only once its declared size fits in the budget, ``server.MAX_BODY`` by default: one
largest body, or several smaller ones, across every worker of the pod. A review that does not
get its share by the policy's deadline is answered HTTP 503 (the API server applies the
webhook's failurePolicy: Fail denies). Real pods' reviews are a few KiB and never wait here.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time

# How often a waiting review looks again.
POLL_SECONDS = 0.005


class BodyBudget:
    """A counter of bytes in shared memory, so that workers forked after it share it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = multiprocessing.get_context("fork").Value("q", 0)

    @property
    def used(self) -> int:
        with self._used.get_lock():
            return int(self._used.value)

    def take(self, size: int) -> bool:
        """Hold ``size`` bytes if they fit (a body as large as the limit fits when nothing else
        is held); False otherwise."""
        with self._used.get_lock():
            if self._used.value and self._used.value + size > self.limit:
                return False
            self._used.value += size
            return True

    def give(self, size: int) -> None:
        with self._used.get_lock():
            self._used.value -= size

    async def wait(self, size: int, seconds: float) -> bool:
        """``take(size)``, trying again until ``seconds`` have passed."""
        ends = time.monotonic() + seconds
        while not self.take(size):
            if time.monotonic() >= ends:
                return False
            await asyncio.sleep(POLL_SECONDS)
        return True

    def hold(self, size: int, seconds: float) -> bool:
        """``take(size)`` from a thread, trying again until ``seconds`` have passed."""
        ends = time.monotonic() + seconds
        while not self.take(size):
            if time.monotonic() >= ends:
                return False
            time.sleep(POLL_SECONDS)
        return True
