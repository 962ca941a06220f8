"""The pod's budget for reading cache deltas' delta.json (admission/delta_reads.py; issue 41
item 4): one read per digest, shared by the names that arrive while it runs and remembered
after; distinct digests read within the budget's bytes at once; a read that cannot get its
share in time fails as a registry that did not answer, and is not remembered."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from kernelbake.admission.delta_reads import DeltaBusy, DeltaReads
from kernelbake.admission.large_bodies import BodyBudget
from kernelbake.contract.delta import Origin
from kernelbake.oci.errors import RegistryUnavailable
from kernelbake.signing.delta import DeltaFacts
from kernelbake.signing.errors import DeltaRefused
from tests.admission.test_deltas import _key

FACTS = DeltaFacts(
    manifest_digest="sha256:" + "d" * 64,
    key=_key(),
    base_image="sha256:" + "1" * 64,
    base_manifest="sha256:" + "2" * 64,
    files=99_996,
    bytes=1 << 20,
    origin=Origin.REBUILT,
    replica="replica-0",
    builder="builder-0",
)


class Gate:
    """A read that waits until the test lets it finish, counting how many run at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()

    def __call__(self) -> DeltaFacts:
        with self._lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.started.release()
        self.release.wait(10)
        with self._lock:
            self.running -= 1
        return FACTS


def _in_threads(*calls: Any) -> tuple[list[threading.Thread], dict[int, Any]]:
    out: dict[int, Any] = {}

    def run(i: int, call: Any) -> None:
        try:
            out[i] = call()
        except Exception as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    return threads, out


def test_names_of_one_digest_share_one_read_and_later_ones_are_answered_from_memory() -> None:
    reads = DeltaReads(seconds=10)
    gate = Gate()
    threads, out = _in_threads(*[lambda: reads("sha256:" + "a" * 64, 100, gate)] * 4)
    assert gate.started.acquire(timeout=10)
    gate.release.set()
    for t in threads:
        t.join()
    assert list(out.values()) == [FACTS] * 4 and reads.reads == 1
    assert reads("sha256:" + "a" * 64, 100, lambda: pytest.fail("read again")) == FACTS


def test_distinct_digests_are_read_within_the_budget_of_the_pod() -> None:
    budget = BodyBudget(150)
    reads = DeltaReads(budget, seconds=10)
    gate = Gate()
    threads, out = _in_threads(
        *[lambda d=d: reads(d, 100, gate) for d in ("sha256:" + "b" * 64, "sha256:" + "c" * 64)]
    )
    assert gate.started.acquire(timeout=10)
    # The second holds off while the first holds 100 of the 150 bytes.
    assert not gate.started.acquire(timeout=0.2) and budget.used == 100
    gate.release.set()
    for t in threads:
        t.join()
    assert gate.most == 1 and list(out.values()) == [FACTS, FACTS] and budget.used == 0


def test_a_read_that_cannot_get_its_share_in_time_is_unavailable_and_not_remembered() -> None:
    budget = BodyBudget(100)
    assert budget.take(100)  # another worker of the pod reads a large delta.json
    reads = DeltaReads(budget, seconds=0.05)
    with pytest.raises(DeltaBusy, match=r"other cache deltas' delta\.json") as caught:
        reads("sha256:" + "e" * 64, 100, lambda: FACTS)
    assert isinstance(caught.value, RegistryUnavailable), "registry_errors decides, nothing is cached"
    budget.give(100)
    assert reads("sha256:" + "e" * 64, 100, lambda: FACTS) == FACTS and reads.reads == 1


def test_a_failed_read_is_not_remembered() -> None:
    reads = DeltaReads(seconds=10)

    def bad() -> DeltaFacts:
        raise DeltaRefused("delta.json: not a cache delta")

    with pytest.raises(DeltaRefused):
        reads("sha256:" + "f" * 64, 10, bad)
    assert reads("sha256:" + "f" * 64, 10, lambda: FACTS) == FACTS and reads.reads == 2
