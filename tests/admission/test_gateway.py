from __future__ import annotations

import threading

from kernelbake.admission.admit import Endpoint
from kernelbake.admission.gateway import Accepted, Gateway, Rejected, Unavailable
from kernelbake.admission.policy import CachePolicy
from kernelbake.admission.references import parse_reference
from kernelbake.contract.key import CacheKey
from tests.admission import documents
from tests.admission.fakes import REPO, FakeVerifier, digest_of, make_admitter, make_policy

TAG = f"{REPO}:h100"
DIGEST = digest_of(TAG)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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
