from __future__ import annotations

import threading

from kernelbake.admission.admit import Endpoint
from kernelbake.admission.gateway import Gateway, RegistryUnavailable
from kernelbake.admission.policy import CachePolicy
from kernelbake.admission.references import parse_reference
from kernelbake.admission.subject import Accepted, Rejected, Unavailable
from kernelbake.contract.key import CacheKey
from tests.admission import documents
from tests.admission.fakes import REPO, FakeVerifier, digest_of, make_admitter, make_policy
from tests.support.clock import Clock

TAG = f"{REPO}:h100"
DIGEST = digest_of(TAG)


def gateway(verifier: FakeVerifier, clock: Clock, **cache: float) -> Gateway:
    policy = CachePolicy(**cache)  # type: ignore[arg-type]
    return Gateway(verifier, cache=policy, workers=4, clock=clock)


def outcome(g: Gateway, image: str) -> object:
    return g.submit(parse_reference(image)).result(timeout=30)


def test_verdicts_are_cached_per_digest_until_their_ttl(verifier: FakeVerifier) -> None:
    clock = Clock()
    g = gateway(verifier, clock, ttl_seconds=60, tag_ttl_seconds=10)
    assert isinstance(outcome(g, TAG), Accepted)
    # The tag's resolution and the digest's verdict are both cached.
    assert isinstance(outcome(g, TAG), Accepted)
    assert isinstance(outcome(g, f"{REPO}@{DIGEST}"), Accepted)
    assert isinstance(outcome(g, f"{REPO}:other-tag@{DIGEST}"), Accepted)
    assert verifier.calls == [TAG]
    clock.now += 11  # the tag must be looked at again; the digest is still good
    assert isinstance(outcome(g, f"{REPO}@{DIGEST}"), Accepted)
    assert verifier.calls == [TAG]
    assert isinstance(outcome(g, TAG), Accepted)
    assert verifier.calls == [TAG, TAG]
    clock.now += 61
    assert isinstance(outcome(g, f"{REPO}@{DIGEST}"), Accepted)
    assert verifier.calls == [TAG, TAG, f"{REPO}@{DIGEST}"]


def test_a_resolver_turns_a_moved_tag_into_a_cache_lookup(verifier: FakeVerifier) -> None:
    clock = Clock()
    resolved: list[str] = []

    def resolve(reference: str) -> str:
        resolved.append(reference)
        return DIGEST

    policy = CachePolicy(ttl_seconds=60, tag_ttl_seconds=10)
    g = Gateway(verifier, cache=policy, workers=2, resolve=resolve, clock=clock)
    assert isinstance(outcome(g, TAG), Accepted)
    clock.now += 11
    assert isinstance(outcome(g, TAG), Accepted)
    assert resolved == [TAG, TAG]
    assert verifier.calls == [f"{REPO}@{DIGEST}"]


def test_rejections_are_cached_briefly_and_registry_failures_never(verifier: FakeVerifier) -> None:
    clock = Clock()
    g = gateway(verifier, clock, rejected_ttl_seconds=5)
    bad = f"{REPO}:unsigned"
    assert isinstance(outcome(g, bad), Rejected)
    assert isinstance(outcome(g, bad), Rejected)
    assert verifier.calls == [bad]
    clock.now += 6
    assert isinstance(outcome(g, bad), Rejected)
    assert verifier.calls == [bad, bad]
    verifier.down = True
    assert isinstance(outcome(g, TAG), Unavailable)
    verifier.down = False
    assert isinstance(outcome(g, TAG), Accepted)
    assert verifier.calls == [bad, bad, TAG, TAG]


def test_concurrent_reviews_of_one_image_share_one_verification(verifier: FakeVerifier) -> None:
    verifier.gate = threading.Event()
    g = gateway(verifier, Clock())
    futures = [g.submit(parse_reference(TAG)) for _ in range(20)]
    verifier.gate.set()
    assert all(isinstance(f.result(timeout=30), Accepted) for f in futures)
    assert verifier.calls == [TAG]


def test_the_cache_is_bounded(verifier: FakeVerifier, keys: dict[str, CacheKey]) -> None:
    for i in range(50):
        verifier.add(f"{REPO}:t{i}", keys["h100"])
    g = gateway(verifier, Clock(), max_entries=10)
    for i in range(50):
        assert isinstance(outcome(g, f"{REPO}:t{i}"), Accepted)
    assert g.cached_entries <= 20
    # The oldest were evicted, the newest are still there.
    assert g.cached(parse_reference(f"{REPO}:t0")) is None
    assert g.cached(parse_reference(f"{REPO}:t49")) is not None


def test_a_verifier_bug_rejects_instead_of_crashing() -> None:
    def broken(reference: str) -> object:
        raise ZeroDivisionError("oops")

    g = Gateway(broken, cache=CachePolicy(), workers=1)  # type: ignore[arg-type]
    result = outcome(g, TAG)
    assert isinstance(result, Rejected) and "ZeroDivisionError" in result.reason


def test_a_slow_registry_is_a_denial_within_the_deadline(verifier: FakeVerifier) -> None:
    verifier.gate = threading.Event()
    admitter = make_admitter(verifier, make_policy(deadline_seconds=0.2))
    response = admitter.review(documents.load("pod-create", TAG), Endpoint.MUTATE)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert "verification did not finish within 0.2s" in response["status"]["message"]
    # The verification goes on in the background and the next review finds it cached.
    verifier.gate.set()
    admitter.gateway.submit(parse_reference(TAG)).result(timeout=30)
    assert admitter.review(documents.load("pod-create", TAG), Endpoint.MUTATE)["response"]["allowed"] is True


class PerRegistry:
    """A verifier that holds every call for one registry until released."""

    def __init__(self, verifier: FakeVerifier, slow: str) -> None:
        self.verifier = verifier
        self.slow = slow
        self.release = threading.Event()
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, reference: str) -> object:
        with self._lock:
            self.calls.append(reference)
        if reference.startswith(self.slow + "/"):
            self.release.wait(30)
            raise RegistryUnavailable(f"registry {self.slow} timed out")
        return self.verifier(reference)


SLOW = "slow.example.com:5000"


def test_a_flooded_registry_keeps_to_its_share_and_its_queue(verifier: FakeVerifier) -> None:
    held = PerRegistry(verifier, SLOW)
    g = Gateway(held, cache=CachePolicy(), workers=4, registry_workers=2, registry_queue=3)  # type: ignore[arg-type]
    try:
        burst = [g.submit(parse_reference(f"{SLOW}/kernelbake/x@{digest_of(str(i))}")) for i in range(8)]
        assert (g.running(SLOW), g.queued(SLOW)) == (2, 3)
        refused = [f.result(timeout=0) for f in burst[5:]]
        assert all(isinstance(o, Unavailable) for o in refused)
        assert {o.reason for o in refused} == {  # type: ignore[union-attr]
            f"could not ask: registry {SLOW} is saturated (3 verifications queued)"
        }
        # The healthy registry verifies at once, beside the two held verifications.
        assert isinstance(outcome(g, TAG), Accepted)
    finally:
        held.release.set()
    assert all(isinstance(f.result(timeout=30), Unavailable) for f in burst)


def test_a_queued_verification_nobody_waits_for_is_dropped(verifier: FakeVerifier) -> None:
    held = PerRegistry(verifier, SLOW)
    g = Gateway(held, cache=CachePolicy(), workers=2, registry_workers=1, registry_queue=5)  # type: ignore[arg-type]
    running_ref = parse_reference(f"{SLOW}/kernelbake/x@{digest_of('running')}")
    queued_ref = parse_reference(f"{SLOW}/kernelbake/x@{digest_of('queued')}")
    running = g.submit(running_ref)
    first, second = g.submit(queued_ref), g.submit(queued_ref)
    assert first is second and g.queued(SLOW) == 1
    g.done_waiting([first])
    assert g.queued(SLOW) == 1, "another review still waits for it"
    g.done_waiting([second, running])
    assert g.queued(SLOW) == 0 and first.cancelled()
    # The running one goes on (it fills the cache) and still holds only its own lane.
    assert not running.done() and g.running(SLOW) == 1
    assert isinstance(outcome(g, TAG), Accepted)
    # A new review of the dropped digest queues it again.
    again = g.submit(queued_ref)
    assert again is not first and g.queued(SLOW) == 1
    held.release.set()
    assert isinstance(again.result(timeout=30), Unavailable)
    assert held.calls.count(queued_ref.by_digest()) == 1


def test_reviews_that_time_out_drop_their_queued_verifications(verifier: FakeVerifier) -> None:
    held = PerRegistry(verifier, SLOW)
    policy = make_policy(
        images=[f"{SLOW}/kernelbake/**"], deadline_seconds=0.2, concurrency=2, registry_concurrency=1
    )
    admitter = make_admitter(held, policy)
    try:
        answers = []
        for i in range(3):
            doc = documents.load("pod-create", f"{SLOW}/kernelbake/x@{digest_of(str(i))}")
            answers.append(admitter.review(doc, Endpoint.VALIDATE)["response"])
        assert all(a["status"]["code"] == 503 for a in answers)
        # The first held the lane; the other two waited in the queue and were dropped with their review.
        assert admitter.gateway.queued(SLOW) == 0 and admitter.gateway.running(SLOW) == 1
    finally:
        held.release.set()
    assert held.calls == [f"{SLOW}/kernelbake/x@{digest_of('0')}"]


def test_a_saturated_registry_denies_with_503_and_says_so(verifier: FakeVerifier) -> None:
    held = PerRegistry(verifier, SLOW)
    policy = make_policy(
        images=[f"{SLOW}/kernelbake/**"], concurrency=2, registry_concurrency=1, registry_queue=0
    )
    admitter = make_admitter(held, policy)
    try:
        admitter.gateway.submit(parse_reference(f"{SLOW}/kernelbake/x@{digest_of('busy')}"))
        doc = documents.load("pod-create", f"{SLOW}/kernelbake/x@{digest_of('next')}")
        response = admitter.review(doc, Endpoint.VALIDATE)["response"]
    finally:
        held.release.set()
    assert response["allowed"] is False and response["status"]["code"] == 503
    assert (
        f"could not ask: registry {SLOW} is saturated (0 verifications queued)"
        in response["status"]["message"]
    )
