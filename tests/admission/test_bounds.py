"""What one review may cost (issue 32, item 1): replies and denial messages of a few KiB however
many problems a pod has, caps on the lists a pod author chooses (denied with the field and the
cap), work linear in the pod spec (structural counts, never timings: the adversarial bench
measures time), the decision off the event loop, and a CPU budget per review."""

from __future__ import annotations

import asyncio
import copy
import http.client
import json
import multiprocessing
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from kernelbake.admission import admit, bounds, gpus
from kernelbake.admission.admit import Endpoint
from kernelbake.admission.bounds import Budget, OverBudget
from kernelbake.admission.http import codec, server
from kernelbake.admission.large_bodies import BodyBudget
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.review import parse_review
from kernelbake.admission.rules import reference
from kernelbake.admission.rules.caches import ANNOTATION_CONTAINER
from kernelbake.admission.scheduling import Operator, Requirement, Way
from kernelbake.admission.service import Admitter
from kernelbake.admission.variants import Picker
from kernelbake.catalogue import load_catalogue
from kernelbake.contract.artifact import ArtifactKind
from kernelbake.contract.key import CacheKey
from kernelbake.contract.variants import Variant
from kernelbake.gfd import PRODUCT
from kernelbake.oci.types import OCI_MANIFEST
from kernelbake.plan import plan as plan_targets
from kernelbake.spec import load_spec
from tests.admission import documents
from tests.admission.conftest import running_server
from tests.admission.documents import H100
from tests.admission.fakes import REPO, FakeVerifier, make_admitter, make_policy
from tests.admission.live import client_tls
from tests.admission.test_cache_volumes import _ArtifactVerifier, cpu_key, facts_of, recipe
from tests.conftest import REPO as SOURCE_TREE

# The message is bounds.MESSAGE_BYTES after its "kernelbake admission: " prefix.
MESSAGE_MAX = bounds.MESSAGE_BYTES + 64


def review_of(obj: dict[str, Any]) -> dict[str, Any]:
    return documents.review_of(obj, uid="7f0b2a4c-0000-4000-8000-000000000032")


def answer(admitter: Admitter, doc: dict[str, Any], endpoint: Endpoint = Endpoint.VALIDATE) -> dict[str, Any]:
    got: dict[str, Any] = admitter.review(doc, endpoint)
    return got


def review_once(
    verifier: Callable[[str], Any],
    doc: dict[str, Any],
    endpoint: Endpoint = Endpoint.VALIDATE,
    *,
    policy: AdmissionPolicy | None = None,
) -> dict[str, Any]:
    """One review by an admitter of its own, whose gateway is closed after."""
    admitter = make_admitter(verifier, policy)
    try:
        return answer(admitter, doc, endpoint)
    finally:
        admitter.gateway.close()


def reply_bytes(reply: dict[str, Any]) -> int:
    return len(json.dumps(reply, separators=(",", ":")).encode())


def cache_pod(volumes: int, containers: int) -> dict[str, Any]:
    """The image-volume recipe with ``volumes`` image volumes of its signed artifact and
    ``containers`` containers mounting something at the cache root, each running another
    engine image than the one the caches were compiled in: volumes times containers problems."""
    doc = recipe("image-volume.yaml")
    spec = doc["spec"]["template"]["spec"]
    artifact = next(v for v in spec["volumes"] if "image" in v)
    spec["volumes"] = [
        {"name": f"art-{i}", "image": copy.deepcopy(artifact["image"])} for i in range(volumes)
    ] + [{"name": "kernelbake-cache", "emptyDir": {}}]
    engine = spec["containers"][0]
    spec.pop("initContainers")
    spec["containers"] = [
        {
            **copy.deepcopy(engine),
            "name": f"c{i}",
            "image": engine["image"].split("@")[0] + "@sha256:" + "9" * 64,
            "volumeMounts": [{"name": "kernelbake-cache", "mountPath": "/opt/kernelbake/cache"}],
        }
        for i in range(containers)
    ]
    return doc


@pytest.fixture
def cache_admitter(keys: dict[str, CacheKey]) -> Any:
    facts, artifact, _ = facts_of(recipe("image-volume.yaml"))
    verifier = _ArtifactVerifier(artifact, cpu_key(keys), facts)
    verifier.art_digest = artifact.split("@")[1]
    admitter = make_admitter(
        verifier, make_policy(images=["registry.example.com/kb/**", f"{REPO.split('/')[0]}/kernelbake/**"])
    )
    yield admitter
    admitter.gateway.close()


def test_volumes_times_containers_of_a_cache_artifact_get_a_reply_of_a_few_kib(cache_admitter: Any) -> None:
    # Issue 32: n=300 gave a 47 MB reply (n² problems, each naming its container). 200
    # volumes: under the cap of governed images, over the one of governed image volumes.
    reply = answer(cache_admitter, review_of(cache_pod(200, 300)))
    assert reply["response"]["allowed"] is False
    assert reply_bytes(reply) <= MESSAGE_MAX + 512
    # Past the cap of governed image volumes: denied with the field and the cap.
    message = reply["response"]["status"]["message"]
    assert "image volumes naming governed repositories has 200 entries" in message
    assert f"at most {bounds.MAX_CACHE_VOLUMES}" in message


def test_under_the_volume_cap_the_problems_are_one_per_cause_with_a_count(cache_admitter: Any) -> None:
    reply = answer(cache_admitter, review_of(cache_pod(bounds.MAX_CACHE_VOLUMES, 300)))
    message = reply["response"]["status"]["message"]
    assert reply["response"]["allowed"] is False
    assert len(message.encode()) <= MESSAGE_MAX
    # One cause (the wrong engine image) for every container: said once, naming a few.
    assert message.count("run that image pinned by digest") == 1, message
    assert 'container "c0", container "c1", container "c2" and 297 more: runs' in message


def test_cache_volumes_times_containers_stop_collecting_at_the_problem_cap(
    cache_admitter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bench/admission_adversarial.py: 16 volumes x 38,000 containers (an 8 MiB body) made some
    # 600,000 problem strings, 240 MiB in one worker, before the message kept a few of them.
    collected: list[int] = []
    real = bounds.message

    def recording(problems: Sequence[str], **kwargs: Any) -> str:
        problems = list(problems)
        collected.append(len(problems))
        return real(problems, **kwargs)

    monkeypatch.setattr(bounds, "message", recording)
    reply = answer(cache_admitter, review_of(cache_pod(bounds.MAX_CACHE_VOLUMES, 2000)))
    assert reply["response"]["allowed"] is False
    assert collected and max(collected) <= bounds.MAX_PROBLEMS + 1, collected
    message = reply["response"]["status"]["message"]
    assert f"stopped checking after {bounds.MAX_PROBLEMS} problems" in message
    assert 'container "c0", container "c1", container "c2" and ' in message


def test_too_many_governed_images_are_denied_naming_the_cap(verifier: FakeVerifier) -> None:
    doc = documents.load("deployment-create", f"{REPO}:h100")
    spec = documents.pod_spec(doc)
    first = spec["containers"][0]
    spec["containers"] = [{**first, "name": f"c{i}"} for i in range(bounds.MAX_GOVERNED + 1)]
    reply = review_once(verifier, doc, Endpoint.MUTATE)
    assert reply["response"]["allowed"] is False
    assert reply["response"]["status"]["code"] == 400
    message = reply["response"]["status"]["message"]
    # The template's init container names the image too.
    assert f"governed images (containers and image volumes) has {bounds.MAX_GOVERNED + 2} entries" in message
    assert f"at most {bounds.MAX_GOVERNED}" in message
    # Nothing was verified: the cap is met before any registry is asked.
    assert verifier.calls == []


@pytest.mark.parametrize(
    ("terms", "field", "limit"),
    [
        (
            [
                {
                    "matchExpressions": [
                        documents.expr(PRODUCT, "In", *[f"p{i}" for i in range(bounds.MAX_VALUES + 1)])
                    ]
                }
            ],
            "nodeSelectorTerms[0].matchExpressions[0].values",
            bounds.MAX_VALUES,
        ),
        (
            [{"matchExpressions": [documents.expr(PRODUCT, "In", H100)]}] * (bounds.MAX_TERMS + 1),
            "nodeSelectorTerms",
            bounds.MAX_TERMS,
        ),
        (
            [{"matchExpressions": [documents.expr(PRODUCT, "Exists")] * (bounds.MAX_EXPRESSIONS + 1)}],
            "nodeSelectorTerms[0].matchExpressions",
            bounds.MAX_EXPRESSIONS,
        ),
    ],
)
def test_placement_lists_past_their_cap_are_denied_naming_the_field(
    verifier: FakeVerifier, terms: list[Any], field: str, limit: int
) -> None:
    doc = documents.schedule(documents.load("deployment-create", f"{REPO}:h100"), terms=terms)
    reply = review_once(verifier, doc)
    assert reply["response"]["allowed"] is False
    message = reply["response"]["status"]["message"]
    assert field in message and f"at most {limit}" in message, message
    assert len(message.encode()) <= MESSAGE_MAX


class Counted(str):
    """A string that counts how often it is compared for equality (a list lookup compares
    with every element; a set lookup with the few of the same hash)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_intersecting_product_lists_is_linear_in_their_length() -> None:
    # Issue 32: two In lists of K products were intersected with a list lookup per product, K².
    k = 1000
    products = [f"NVIDIA-Made-Up-{i}" for i in range(k)]
    first = Requirement(PRODUCT, Operator.IN, tuple(Counted(p) for p in products))
    second = Requirement(PRODUCT, Operator.IN, tuple(Counted(p) for p in reversed(products)))
    Counted.compared = 0
    found = gpus.admitted(Way("test", (first, second)), load_catalogue())
    assert len(found.gpus) == k
    assert Counted.compared <= 10 * k, Counted.compared


class CountingJudge(gpus.Judge):
    def __init__(self) -> None:
        super().__init__(load_catalogue(), make_policy().gpu_match)
        self.calls = 0

    def __call__(self, key: CacheKey, ways: Sequence[Way]) -> gpus.GpuVerdict:
        self.calls += 1
        return super().__call__(key, ways)


def test_containers_naming_one_image_are_judged_once_per_review(verifier: FakeVerifier) -> None:
    # Issue 32: the judge's memo hashed every expression value of the pod for every container.
    doc = documents.load("deployment-create", f"{REPO}:h100")
    documents.schedule(
        doc,
        terms=[{"matchExpressions": [documents.expr(PRODUCT, "In", H100, *[f"x{i}" for i in range(500)])]}],
    )
    spec = documents.pod_spec(doc)
    first = spec["containers"][0]
    spec["containers"] = [{**first, "name": f"c{i}"} for i in range(200)]
    admitter = make_admitter(verifier)
    try:
        planned = admit.plan(parse_review(doc), admitter.policy)
        assert isinstance(planned, admit.Plan)
        outcomes, futures = admitter._lookup(planned.refs)
        for target, future in futures.items():
            outcomes[target] = future.result(10)
        judge = CountingJudge()
        admit.decide(planned, outcomes, admitter.policy, judge, Endpoint.MUTATE)
    finally:
        admitter.gateway.close()
    assert judge.calls == 1


def test_the_decision_after_a_verification_runs_off_the_event_loop(
    verifier: FakeVerifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 32: one uncached digest made the whole (large) decision run on the loop.
    from kernelbake.admission import service

    ran_on: list[int] = []
    real = service.decide

    def recording(*args: Any, **kwargs: Any) -> Any:
        ran_on.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "decide", recording)
    admitter = make_admitter(verifier)
    doc = documents.load("deployment-create", f"{REPO}:h100")

    async def main() -> tuple[int, dict[str, Any]]:
        pending = admitter.review_nowait(doc, Endpoint.MUTATE, started=time.monotonic())
        assert not isinstance(pending, dict), "the first review of a digest waits for it"
        return threading.get_ident(), await pending

    try:
        loop_thread, reply = asyncio.run(main())
    finally:
        admitter.gateway.close()
    assert reply["response"]["allowed"] is True
    assert ran_on and loop_thread not in ran_on


def test_a_review_over_its_cpu_budget_is_denied(verifier: FakeVerifier) -> None:
    policy = make_policy()
    from kernelbake.admission.gateway import Gateway

    gateway = Gateway(verifier, cache=policy.cache, workers=2)
    admitter = Admitter(policy, gateway, review_cpu_seconds=0.0)
    try:
        reply = answer(admitter, documents.load("deployment-create", f"{REPO}:h100"))
    finally:
        gateway.close()
    assert reply["response"]["allowed"] is False
    assert "took more than 0 s of CPU" in reply["response"]["status"]["message"]


def test_the_budget_counts_cpu_across_the_threads_of_a_review() -> None:
    now = [0.0]
    budget = Budget(1.0, clock=lambda: now[0], every=1)
    with budget:
        now[0] = 0.6
        budget.check()
    now[0] = 10.0  # time on another thread, or waiting, is not the review's
    with budget:
        now[0] = 10.3
        budget.check()
        now[0] = 10.5
        with pytest.raises(OverBudget, match="more than 1 s of CPU"):
            budget.check()


def test_a_huge_annotation_gets_a_message_of_a_few_kib(keys: dict[str, CacheKey]) -> None:
    doc = recipe("opt-in.yaml")
    doc["spec"]["template"]["metadata"]["annotations"][ANNOTATION_CONTAINER] = "x" * 1_000_000
    facts, artifact, _ = facts_of(recipe("image-volume.yaml"))
    reply = review_once(
        _ArtifactVerifier(artifact, cpu_key(keys), facts),
        review_of(doc),
        Endpoint.MUTATE,
        policy=make_policy(images=["registry.example.com/kb/**"]),
    )
    assert reply["response"]["allowed"] is False
    assert reply_bytes(reply) <= MESSAGE_MAX + 512
    assert ANNOTATION_CONTAINER in reply["response"]["status"]["message"]


def test_warn_mode_warnings_are_capped(verifier: FakeVerifier) -> None:
    doc = documents.load("deployment-create", f"{REPO}:unsigned")
    spec = documents.pod_spec(doc)
    first = spec["containers"][0]
    spec["containers"] = [{**first, "name": f"c{i}", "image": f"{REPO}:unsigned{i}"} for i in range(100)]
    reply = review_once(verifier, doc, policy=make_policy(mode="warn"))
    assert reply["response"]["allowed"] is True
    warnings = reply["response"]["warnings"]
    assert len(warnings) == bounds.MAX_WARNINGS
    assert "more warnings left out" in warnings[-1]


def test_messages_keep_one_entry_per_cause_within_the_limit() -> None:
    problems = [f'container "c{i}": runs x, not y' for i in range(10_000)]
    problems += [f"cause {i} of its own, spelled out at some length to fill the message" for i in range(500)]
    text = bounds.message(problems)
    assert len(text.encode()) <= bounds.MESSAGE_BYTES
    assert text.startswith('container "c0", container "c1", container "c2" and 9997 more: runs x, not y')
    assert text.endswith("(10500 in all)")


def test_an_unreadable_megabyte_image_is_not_kept_by_the_memo(verifier: FakeVerifier) -> None:
    before = reference._classify_memo.cache_info().currsize
    doc = documents.load("deployment-create", "registry.example.com/" + "a/" * 500_000 + "x:1")
    reply = review_once(verifier, doc)
    assert reply["response"]["allowed"] is False
    assert reference._classify_memo.cache_info().currsize == before


def test_a_large_body_is_decoded_letting_other_threads_run() -> None:
    # bench/admission_adversarial.py: json's C decoder held the GIL for all of an 8 MiB body
    # (some 100 ms on a busy core), so the event loop, and /healthz, waited for it. Counted as
    # turns another thread gets while the decode runs, not as time.
    body = json.dumps({"containers": [{"name": f"c{i}", "image": "x"} for i in range(120_000)]}).encode()
    assert len(body) > codec.YIELDING_BODY
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0001)
    inside = threading.Event()
    stop = threading.Event()
    turns = 0

    def other() -> None:
        nonlocal turns
        while not stop.is_set():
            if inside.is_set():
                turns += 1
            time.sleep(0)  # gives the GIL back: each turn is one more hand-over

    thread = threading.Thread(target=other)
    thread.start()
    try:
        inside.set()
        doc = codec.decode(body)
        inside.clear()
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert doc == json.loads(body)
    assert turns >= 50, turns


def test_the_body_budget_is_shared_with_forked_workers() -> None:
    budget = BodyBudget(100)
    fork = multiprocessing.get_context("fork")
    took, release = fork.Event(), fork.Event()

    def worker() -> None:
        assert budget.take(100)
        took.set()
        release.wait(30)
        budget.give(100)

    child = fork.Process(target=worker)
    child.start()
    try:
        assert took.wait(30)
        # The other worker's body holds all of it.
        assert not budget.take(1)
    finally:
        release.set()
        child.join(30)
    assert child.exitcode == 0
    assert budget.take(60) and budget.take(40) and not budget.take(1)
    budget.give(100)
    # One body as large as the budget fits when nothing else is held.
    assert budget.take(100) and budget.used == 100


def test_a_large_review_waits_for_the_pods_body_budget(
    verifier: FakeVerifier, certs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bench/admission_adversarial.py: three 8 MiB reviews at once on each of two workers took
    # 900 MiB against the pod's 512 MiB. Bodies over INLINE_BODY share MAX_BODY across the pod.
    bodies = BodyBudget(server.MAX_BODY)
    admitter = make_admitter(verifier, make_policy(deadline_seconds=1))
    doc = documents.load("deployment-create", f"{REPO}:h100")
    small = json.dumps(doc).encode()
    doc["request"]["object"]["metadata"]["annotations"] = {"example.com/pad": "x" * server.INLINE_BODY}
    large = json.dumps(doc).encode()
    tls = client_tls(certs)
    # The C heap is given back after each large review (glibc's malloc_trim), not after others.
    trimmed: list[int] = []

    def trim(pad: int) -> int:
        trimmed.append(pad)
        return 1

    monkeypatch.setattr(server, "_TRIM", trim)

    def post(body: bytes) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=30)
        try:
            conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            conn.close()

    with running_server(admitter, certs, bodies=bodies) as port:
        # Another worker of the pod holds a body as large as a body may be.
        assert bodies.take(server.MAX_BODY)
        status, answer = post(large)
        assert status == 503 and "as many large bodies as its memory allows" in answer["error"]
        # A real pod's review does not wait.
        status, answer = post(small)
        assert status == 200 and answer["response"]["allowed"] is True
        assert trimmed == []
        bodies.give(server.MAX_BODY)
        status, answer = post(large)
        assert status == 200 and answer["response"]["allowed"] is True
        assert bodies.used == 0
        ends = time.monotonic() + 10
        while not trimmed and time.monotonic() < ends:
            time.sleep(0.01)
        assert trimmed == [0]


def test_the_shared_memos_do_not_keep_a_large_placement() -> None:
    # bench/admission_adversarial.py: each 8 MiB placement (64 terms x 64 In lists of 85
    # products) stayed in the judge's memo, some 45 MiB a review, up to 4096 of them.
    values = (H100, *(f"NVIDIA-Made-Up-{i}" for i in range(85)))
    large = [Way(f"term {t}", (Requirement(PRODUCT, Operator.IN, values),) * 64) for t in range(64)]
    small = [Way("nodeSelector", (Requirement(PRODUCT, Operator.IN, (H100,)),))]
    catalogue = load_catalogue()
    judge = gpus.Judge(catalogue, make_policy().gpu_match)
    picker = Picker(catalogue, make_policy().gpu_match)
    (target,) = plan_targets(load_spec(SOURCE_TREE / "images" / "qwen3-0.6b.yaml"), ["h100"], registry="r")
    variants = (
        Variant(
            key=target.key,
            digest="sha256:" + "1" * 64,
            size=1,
            media_type=OCI_MANIFEST,
            kind=ArtifactKind.IMAGE,
        ),
    )
    for ways in (large, small):
        judge(target.key, ways)
        picker(variants, ways)
    assert judge(target.key, small).ok and picker(variants, small).variant is not None
    # The small placement is kept (warm reviews skip the comparisons), the large one is not.
    assert len(judge._memo) == 1 and len(picker._memo) == 1
