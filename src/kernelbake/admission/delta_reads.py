"""One signed blob, many names (issue 41, item 4): a cache delta's delta.json is read once per
digest, and a pod reads a bounded number of bytes of them at once.

A delta's ``delta.json`` may list 100,000 files (``contract.delta.MAX_FILES``): some 24 MB of
JSON and, while it is parsed, some 120 MiB of the worker's memory. The same bytes copied under
other repository names verify under each (each name has its own signature), and each name was
a parse of its own: four names of one 99,996-file delta, reviewed at once, OOM-killed the
512 MiB webhook. Here, around the parse (``signing.delta.ParseOnce``):

- **once per digest**: the layer's digest names its bytes (the registry client checks them), so
  its facts are kept by digest (``entries`` of them, a few hundred bytes each) and a name that
  arrives while the same digest is being parsed waits for that parse;
- **once per pod**: with ``pod`` (``admission.pod_facts``, made before the workers are forked),
  a worker takes the facts another worker of the pod read, or waits for its read, instead of
  waiting for the budget and parsing the same bytes again;
- **a budget per pod**: a parse holds its layer's declared size in a ``BodyBudget`` the parent
  makes before it forks the workers, ``BUDGET`` bytes (one largest delta.json, or several
  smaller ones) across every worker of the pod; one that does not get its share within
  ``seconds`` fails as the registry being unavailable would (``registry_errors`` decides), and is
  not remembered.

The signature is still verified under every name: it is what a name's repository vouches for.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable

from kernelbake.admission.large_bodies import POLL_SECONDS, BodyBudget
from kernelbake.admission.pod_facts import Claim, PodFacts
from kernelbake.cache import BoundedCache
from kernelbake.contract.delta import MAX_MANIFEST_BYTES
from kernelbake.oci.errors import RegistryUnavailable
from kernelbake.signing.delta import DeltaFacts

# The largest delta.json layer a verification fetches (signing.delta._manifest_layer's bound).
BUDGET = MAX_MANIFEST_BYTES + (64 << 10)
ENTRIES = 256


class DeltaBusy(RegistryUnavailable):
    """The pod is reading other deltas' delta.json for longer than a verification may wait."""


class DeltaReads:
    """A ``signing.delta.ParseOnce`` shared by a worker's verification threads."""

    def __init__(
        self,
        budget: BodyBudget | None = None,
        *,
        seconds: float,
        entries: int = ENTRIES,
        pod: PodFacts | None = None,
    ) -> None:
        self.budget = budget or BodyBudget(BUDGET)
        self.seconds = seconds
        self.pod = pod
        self._facts: BoundedCache[str, DeltaFacts] = BoundedCache(entries)
        self._running: dict[str, concurrent.futures.Future[DeltaFacts]] = {}
        self._lock = threading.Lock()
        # Reads run (not answered from the cache nor shared): what the tests and the bench count.
        self.reads = 0
        # Facts taken from another worker of the pod.
        self.from_pod = 0

    def __call__(self, digest: str, size: int, read: Callable[[], DeltaFacts]) -> DeltaFacts:
        with self._lock:
            if (hit := self._facts.get(digest)) is not None:
                return hit
            running = self._running.get(digest)
            if running is None:
                mine: concurrent.futures.Future[DeltaFacts] = concurrent.futures.Future()
                self._running[digest] = mine
        if running is not None:
            try:
                return running.result(timeout=self.seconds)
            except concurrent.futures.TimeoutError:
                raise DeltaBusy(self._busy(digest)) from None
        try:
            facts = self._once_per_pod(digest, size, read)
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        else:
            mine.set_result(facts)
            return facts
        finally:
            with self._lock:
                del self._running[digest]

    def _once_per_pod(self, digest: str, size: int, read: Callable[[], DeltaFacts]) -> DeltaFacts:
        """The facts another worker of the pod read, after its read if one runs (within
        ``seconds``), else this worker's own read, shared with the others."""
        ends = time.monotonic() + self.seconds
        if self.pod is None:
            return self._read(digest, size, read, ends)
        while (claim := self.pod.claim(digest, stale=self.seconds))[0] is Claim.THEIRS:
            if time.monotonic() >= ends:
                raise DeltaBusy(
                    f"delta.json {digest}: another worker of the pod was reading it for more than "
                    f"{self.seconds:g} s; apply again"
                )
            time.sleep(POLL_SECONDS)
        state, shared = claim
        if shared is not None:
            self.from_pod += 1
            self._facts.put(digest, shared)
            return shared
        try:
            facts = self._read(digest, size, read, ends)
        except BaseException:
            if state is Claim.MINE:
                self.pod.drop(digest)
            raise
        if state is Claim.MINE:
            self.pod.put(digest, facts)
        return facts

    def _read(self, digest: str, size: int, read: Callable[[], DeltaFacts], ends: float) -> DeltaFacts:
        held = min(max(size, 0), self.budget.limit)
        if not self.budget.hold(held, ends - time.monotonic()):
            raise DeltaBusy(self._busy(digest))
        try:
            self.reads += 1
            facts = read()
        finally:
            self.budget.give(held)
        self._facts.put(digest, facts)
        return facts

    def _busy(self, digest: str) -> str:
        return (
            f"delta.json {digest}: the pod was reading other cache deltas' delta.json ({self.budget.limit} B "
            f"at once, across its workers) for more than {self.seconds:g} s; apply again"
        )
