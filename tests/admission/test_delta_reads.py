"""The pod's budget for reading cache deltas' delta.json (admission/delta_reads.py; issue 41
item 4): one read per digest, shared by the names that arrive while it runs and remembered
after; distinct digests read within the budget's bytes at once; a read that cannot get its
share in time fails as a registry that did not answer, and is not remembered."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import multiprocessing
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kernelbake.admission import pod_facts
from kernelbake.admission.delta_reads import DeltaBusy, DeltaReads
from kernelbake.admission.large_bodies import BodyBudget
from kernelbake.admission.pod_facts import Claim, PodFacts
from kernelbake.contract.delta import Origin
from kernelbake.oci.errors import RegistryUnavailable
from kernelbake.signing.delta import DeltaFacts
from kernelbake.signing.errors import DeltaRefused
from tests.admission import documents
from tests.admission.test_deltas import _key
from tests.conftest import REPO as SOURCE_TREE

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


# ---- across the workers of one pod (admission/pod_facts.py) -----------------------------------

DIGEST = "sha256:" + "9" * 64
BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"


def _worker(
    budget: BodyBudget, pod: PodFacts, reads: Any, go: Any, out: Any, seconds: float, fail: bool = False
) -> None:
    """A worker of the pod: its own DeltaReads on the pod's budget and facts; reading takes
    0.5 s (and fails with ``fail``); sends back what it got."""
    mine = DeltaReads(budget, seconds=seconds, pod=pod)

    def read() -> DeltaFacts:
        with reads.get_lock():
            reads.value += 1
        time.sleep(0.5)
        if fail:
            raise DeltaRefused("delta.json: not a cache delta")
        return FACTS

    go.wait(10)
    try:
        out.send(("facts", mine(DIGEST, 100, read) == FACTS, mine.reads, mine.from_pod))
    except Exception as exc:
        out.send((type(exc).__name__, str(exc), mine.reads, mine.from_pod))


def _pod(*fails: bool, seconds: float = 10) -> list[tuple[Any, ...]]:
    """Run one worker per entry of ``fails`` at once, forked after the pod's state was made."""
    fork = multiprocessing.get_context("fork")
    budget, pod = BodyBudget(100), PodFacts()
    reads, go = fork.Value("i", 0), fork.Event()
    pipes = [fork.Pipe() for _ in fails]
    workers = []
    for i, fail in enumerate(fails):
        workers.append(
            fork.Process(target=_worker, args=(budget, pod, reads, go, pipes[i][1], seconds, fail))
        )
        workers[-1].start()
        # The first claims the read before the second asks.
        go.set() if i == 0 else None
        time.sleep(0.1)
    go.set()
    got = [ours.recv() for ours, _ in pipes]
    for w in workers:
        w.join(10)
    assert reads.value == sum(g[2] for g in got)
    return got


def test_workers_of_a_pod_share_one_read_of_a_digest() -> None:
    # Issue 41 item 4: each worker parsed the same delta.json; the second waited for the pod's
    # budget while the first parsed, then parsed again, past the verification deadline.
    first, second = _pod(False, False)
    assert first == ("facts", True, 1, 0)
    assert second == ("facts", True, 0, 1)


def test_a_failed_read_is_not_shared_and_the_other_worker_reads_for_itself() -> None:
    first, second = _pod(True, False)
    assert first == ("DeltaRefused", "delta.json: not a cache delta", 1, 0)
    assert second == ("facts", True, 1, 0)


def test_a_worker_waits_for_another_workers_read_no_longer_than_its_deadline() -> None:
    first, second = _pod(False, False, seconds=0.3)
    assert first[0] == "facts"
    # Unavailable (registry_errors decides), having read nothing: the first holds the budget.
    assert second[0] == "DeltaBusy" and second[2:] == (0, 0)


def test_the_pods_facts_read_back_as_they_were_and_larger_ones_stay_unshared() -> None:
    assert pod_facts.decode(pod_facts.encode(FACTS)) == FACTS
    pod = PodFacts(slots=2)
    assert pod.claim(DIGEST, stale=10) == (Claim.MINE, None)
    assert pod.claim(DIGEST, stale=10) == (Claim.THEIRS, None)
    pod.put(DIGEST, FACTS)
    assert pod.claim(DIGEST, stale=10) == (Claim.DONE, FACTS)
    large = "sha256:" + "8" * 64
    assert pod.claim(large, stale=10) == (Claim.MINE, None)
    pod.put(large, dataclasses.replace(FACTS, replica="r" * pod_facts.FACTS_BYTES))
    assert pod.claim(large, stale=10) == (Claim.MINE, None)


def test_the_pods_table_is_bounded_and_a_stale_claim_is_taken_over() -> None:
    pod = PodFacts(slots=2)
    digests = [f"sha256:{i:064x}" for i in range(3)]
    assert [pod.claim(d, stale=10)[0] for d in digests] == [Claim.MINE, Claim.MINE, Claim.FULL]
    pod.put(digests[0], FACTS)
    # The slot read longest ago gives way to a new digest; one being read does not.
    assert pod.claim(digests[2], stale=10)[0] is Claim.MINE
    assert pod.claim(digests[0], stale=10)[0] is Claim.FULL
    assert pod.reading() == 2
    # A read claimed longer ago than a verification may wait is taken over.
    assert pod.claim(digests[1], stale=0.0)[0] is Claim.MINE


def test_the_webhooks_workers_fetch_a_delta_json_once_for_the_pod(tmp_path: Path) -> None:
    """The command as deployed (two workers): the review of a pod naming one signed delta under
    four names goes to both workers in turn; the delta.json layer is fetched (and parsed) by
    the first alone. Before, each worker fetched and parsed it (bench/admission_adversarial.py:
    the second waited for the pod's budget, parsed again, and denied past the deadline)."""
    from kernelbake.oci import RegistryClient, parse_reference
    from kernelbake.settings import Settings
    from kernelbake.signing.delta import push_delta
    from kernelbake.signing.keys import generate_key_pair, load_private_key
    from kernelbake.signing.sign import sign_image
    from kernelbake.signing.signer import KeySigner
    from tests.admission import live
    from tests.admission.live import client_tls
    from tests.signing.images import push_image
    from tests.signing.test_delta import _dir
    from tests.support.memregistry import memory_registry

    certs = tmp_path / "certs"
    subprocess.run(
        [str(SOURCE_TREE / "deploy" / "make-cert.sh"), "--out", str(certs), "--ip", "127.0.0.1"],
        check=True,
        capture_output=True,
    )
    with memory_registry() as (addr, store):
        client = RegistryClient(Settings(docker_config=tmp_path / "docker"), timeout=10.0)
        private, public = generate_key_pair(tmp_path / "k", name="kb")
        signer = KeySigner(load_private_key(private))
        base = push_image(client, f"{addr}/kb/base:v1", tmp_path / "img")
        sign_image(base.pinned, signer, client=client)
        source = _dir(tmp_path / "a", base)
        names = [f"{addr}/kb/copy{i}:delta" for i in range(4)]
        pushed = [push_delta(source, base=base.pinned, signer=signer, client=client, to=n) for n in names]
        layer = client.get_manifest(parse_reference(pushed[0].reference)).layers[-1].digest
        policy = live.write_policy(
            tmp_path / "policy.yaml", [f"{addr}/kb/**"], {"keys": [str(public)], "require_attestation": False}
        )
        spec = {
            "containers": [{"name": "c", "image": base.pinned}],
            "volumes": [{"name": f"d{i}", "image": {"reference": p.tagged}} for i, p in enumerate(pushed)],
        }
        with live.serving(policy, certs, workers=2) as served:
            workers: set[int | None] = set()
            for i in range(32):
                doc = documents.load("pod-create", base.pinned, uid=f"u{i}")
                doc["request"]["object"]["spec"] |= spec
                conn = http.client.HTTPSConnection(
                    "127.0.0.1", served.port, context=client_tls(certs), timeout=30
                )
                try:
                    conn.request(
                        "POST",
                        "/validate",
                        body=json.dumps(doc),
                        headers={"Content-Type": "application/json"},
                    )
                    assert conn.getresponse().status == 200
                    workers.add(_peer_worker(conn, served.process.pid, served.port))
                finally:
                    conn.close()
                if len(workers - {None}) == 2:
                    break
            assert len(workers - {None}) == 2, "the kernel sent every connection to one worker"
        assert store.blob_gets[layer] == 1, f"delta.json fetched {store.blob_gets[layer]} times by one pod"
        # Each name's own signature was still read by both workers.
        for i in range(4):
            # The name's own bundles (its signature among them), in its repository.
            bundles = [
                doc
                for (repo, _), (data, _) in store.manifests.items()
                if repo == f"kb/copy{i}" and (doc := json.loads(data)).get("artifactType") == BUNDLE
            ]
            assert bundles and all(
                store.blob_gets[blob["digest"]] == 2 for doc in bundles for blob in doc["layers"]
            ), f"kb/copy{i}"


def _peer_worker(conn: http.client.HTTPSConnection, server: int, port: int) -> int | None:
    """The pid of the worker (a child of ``server``) holding the other end of ``conn``."""
    mine = conn.sock.getsockname()[1]
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and int(fields[2].split(":")[1], 16) == mine:
            inode = fields[9]
    children = Path(f"/proc/{server}/task/{server}/children").read_text().split()
    for pid in map(int, children):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                if str(fd.readlink()) == f"socket:[{inode}]":
                    return pid
    return None
