"""The cache-only artifact for real: tiny-llama built on vLLM's CPU base with ``--publish both``,
signed, listed in the variant index beside its image, picked by resolve; then the stock engine
image (no kernelbake in it) serves warm from the artifact mounted by podman
(``--mount type=image``), started from the pod spec the admission module patched from
deploy/stock-vllm/opt-in.yaml, and from its init-container fallback (a writable copy, to which
the start adds no file)."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from kernelbake.admission import admit, gpus
from kernelbake.admission.gateway import ImageRejected
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.review import parse_review
from kernelbake.admission.rules.caches import ANNOTATION_INDEX, ANNOTATION_MOUNT, next_cache_refs
from kernelbake.admission.subject import Accepted, IndexAccepted, Outcome, Rejected, VerifiedIndex
from kernelbake.admission.verifying import SignedImageVerifier, verify_policy
from kernelbake.catalogue import load_catalogue
from kernelbake.contract.artifact import ArtifactKind
from kernelbake.contract.engines import DECLARATIONS
from kernelbake.contract.layout import MANIFEST
from kernelbake.fleet import read_index, resolve
from kernelbake.oci import RegistryClient, parse_reference
from kernelbake.pipeline import BuildOptions, Built, Driver, Publish
from kernelbake.plan import plan
from kernelbake.publish.index import publish_index
from kernelbake.remote import read_image
from kernelbake.settings import Settings
from kernelbake.signing.keys import generate_key_pair, load_private_key
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.sign import sign_image
from kernelbake.signing.signer import KeySigner
from kernelbake.signing.verify import verify_image
from kernelbake.spec import load_spec
from tests.admission import documents
from tests.conftest import REPO
from tests.integration import _serving
from tests.integration._serving import complete, wait_healthy
from tests.support.docker import VLLM_CPU_BASE, docker, require_cpu_base
from tests.support.podman import ULIMITS, PodRun, podman, pull, require_podman
from tests.support.registry import free_port

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]

HEALTH_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class Published:
    built: Built
    engine: str  # repo@digest of the engine image in the test registry
    index: str  # repo:tag@digest
    trust: Path  # public key
    client: RegistryClient


@pytest.fixture(scope="module")
def published(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Published:
    """vLLM's CPU base pushed as the stock engine image, then tiny-llama built with --publish both,
    each variant signed, and their index pushed and signed."""
    require_cpu_base(VLLM_CPU_BASE)
    # The engine image as a cluster would pull it: from a registry, by digest. Pushed before
    # the build, so that the daemon knows its manifest digest and the artifact records it.
    engine_tag = f"{registry}/engine/vllm-cpu:0.32.0"
    docker("tag", VLLM_CPU_BASE, engine_tag)
    docker("push", engine_tag)
    digests = json.loads(docker("image", "inspect", "--format", "{{json .RepoDigests}}", engine_tag).stdout)
    engine = next(d for d in digests if d.startswith(f"{registry}/engine/vllm-cpu@"))
    out = tmp_path_factory.mktemp("cache-artifact")
    targets = plan(load_spec(REPO / "images" / "tiny-llama.yaml"), ["cpu"], registry=f"{registry}/stock")
    options = BuildOptions(out=out / "build", push=True, publish=Publish.BOTH)
    (built,) = Driver(Settings.from_env()).build(targets, options)
    assert built.pushed and built.cache and built.cache.pushed
    private, public = generate_key_pair(out / "keys", name="kb")
    signer = KeySigner(load_private_key(private))
    client = RegistryClient(Settings.from_env(), timeout=60)
    for ref in built.published:
        sign_image(ref, signer, client=client)
    index = publish_index(built.published, client=client)
    sign_image(index, signer, client=client, attest=False)
    return Published(built, engine, index, public, client)


def test_the_artifact_is_the_cache_root_and_names_the_engine_image_it_was_compiled_in(
    published: Published,
) -> None:
    cache = published.built.cache
    assert cache is not None and cache.pushed is not None
    ref = parse_reference(cache.pushed)
    facts = read_image(published.client, ref, published.client.get_manifest(ref))
    # One layer per cache kind, then the manifest alone (the signer reads it there).
    kinds = DECLARATIONS[published.built.target.key.engine].cache_kinds
    assert len(facts.manifest.layers) == len(kinds) + 1
    config = json.loads(published.client.get_blob(ref, facts.manifest.config.digest))
    assert not (config.get("config") or {}).get("Entrypoint")
    engine_id = docker("image", "inspect", "--format", "{{.Id}}", VLLM_CPU_BASE).stdout.strip()
    assert cache.facts.engine.config_digest == engine_id
    assert cache.facts.engine.digest == published.engine.split("@")[1]
    policy = VerifyPolicy.from_mapping({"keys": [str(published.trust)]}, source="test")
    art = verify_image(cache.pushed, policy, client=published.client)
    img = verify_image(published.built.pushed or "", policy, client=published.client)
    assert art.artifact == cache.facts and art.key == img.key
    # The same compiled caches: the artifact's manifest is the image's.
    assert art.manifest_digest == img.manifest_digest == cache.facts.manifest_digest
    assert art.attestation["cacheManifest"]["path"] == f"/{MANIFEST}"


def test_the_index_lists_both_and_resolve_picks_each_kind_apart(published: Published) -> None:
    index = read_index(published.index, client=published.client)
    assert index is not None
    assert sorted(v.kind.value for v in index.variants) == ["cache/v1", "image"]
    found = {"device": "cpu", "arch": published.built.target.key.arch}
    art = resolve(index, found, ArtifactKind.CACHE)
    img = resolve(index, found)
    assert art.best is not None and img.best is not None
    cache = published.built.cache
    assert cache is not None and cache.pushed is not None
    assert art.variant(art.best).digest == cache.pushed.split("@")[1]
    assert img.variant(img.best).digest == (published.built.pushed or "").split("@")[1]


def _outcome(verifier: SignedImageVerifier, target: str) -> Outcome:
    try:
        got = verifier(target)
    except ImageRejected as exc:
        return Rejected(str(exc))
    return IndexAccepted(got) if isinstance(got, VerifiedIndex) else Accepted(got)


def patched_pod(published: Published, mode: str | None) -> dict[str, Any]:
    """deploy/stock-vllm/opt-in.yaml for this index and engine, through the webhook's plan and
    decision with the real verifier, patched."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "deploy" / "stock-vllm" / "opt-in.yaml").read_text())
    meta = doc["spec"]["template"]["metadata"]
    meta["annotations"][ANNOTATION_INDEX] = published.index.split("@")[0]
    if mode:
        meta["annotations"][ANNOTATION_MOUNT] = mode
    spec = doc["spec"]["template"]["spec"]
    spec["containers"][0]["image"] = published.engine
    registry = published.index.split("/")[0]
    policy = AdmissionPolicy.from_mapping(
        {"images": [f"{registry}/stock/**"], "verify": {"keys": [str(published.trust)]}}, source="test-policy"
    )
    first = admit.plan(parse_review(documents.review_of(copy.deepcopy(doc))), policy)
    cplan = first.caches
    assert first.final is None and cplan is not None
    assert cplan.opt_in_problems == () and cplan.volume_problems == ()
    verifier = SignedImageVerifier(verify_policy(policy), settings=Settings.from_env(), timeout=60)
    judge = gpus.Judge(load_catalogue(), policy.gpu_match)
    outcomes = {t: _outcome(verifier, t) for t in first.refs}
    for t in next_cache_refs(cplan, outcomes, first.ways, policy, judge):
        outcomes[t] = _outcome(verifier, t)
    decision = admit.decide(first, outcomes, policy, judge, admit.Endpoint.MUTATE)
    assert decision.allowed, decision.message
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(doc), list(decision.patch))
    pod: dict[str, Any] = result["spec"]["template"]["spec"]
    return pod


@contextmanager
def serving(run: PodRun) -> Iterator[tuple[int, str]]:
    port = free_port()
    argv = run.main_argv(["--shm-size", "1g", "-p", f"127.0.0.1:{port}:8000"])
    cid = podman(*argv[1:]).stdout.strip()
    try:
        wait_healthy(podman, port, cid, HEALTH_TIMEOUT_S)
        yield port, cid
    finally:
        podman("rm", "-f", cid, check=False)


def logs(cid: str) -> str:
    return _serving.logs(podman, cid)


def files(root: Path) -> dict[str, int]:
    """Every file under ``root`` and its mtime (ns)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def first_cache_files(root: Path, cid: str) -> list[str]:
    """The files container ``cid`` has written under ``root`` (lock files aside, which come and
    go on a warm start too), once there is one; fails with its log when it stops first."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while True:
        written = [f for f in files(root) if "lock" not in Path(f).name]
        if written:
            return written
        running = podman("inspect", "-f", "{{.State.Running}}", cid, check=False).stdout.strip()
        if running != "true" or time.monotonic() > deadline:
            raise AssertionError(f"the cold start wrote no cache file:\n{logs(cid)[-4000:]}")
        time.sleep(1)


def init_seconds(text: str) -> float:
    """vLLM's ``init engine (profile, create kv cache, warmup model) took N s`` (the CPU build
    logs no per-graph cache line; what a start adds to the cache directory is the evidence)."""
    found = re.search(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s", text)
    assert found is not None, text[-4000:]
    return float(found.group(1))


def test_the_stock_engine_image_serves_warm_from_the_image_volume_admission_patched_in(
    published: Published, tmp_path: Path
) -> None:
    require_podman()
    spec = patched_pod(published, None)
    run = PodRun(spec, tmp_path / "warm", {"models": REPO / "images" / "models"})
    assert [c["name"] for c in spec["initContainers"]] == ["kernelbake-cache-copy"]
    for ref in [published.engine, *run.images]:
        pull(ref)
    cache = tmp_path / "warm" / "emptydir-kernelbake-cache"
    run.init_containers()
    copied = files(cache)
    # The copy is the artifact, mtimes kept (cp -a in the engine image: no kernelbake).
    listing = podman(
        "run", "--rm", *ULIMITS, "--mount", f"type=image,source={run.images[0]},destination=/a",
        "--entrypoint", "python3", published.engine, "-c",
        "import json, pathlib; r = pathlib.Path('/a'); "
        "print(json.dumps({str(p.relative_to(r)): p.stat().st_mtime_ns for p in r.rglob('*') if p.is_file()}))",
    ).stdout  # fmt: skip
    assert copied == json.loads(listing) and f"{MANIFEST}" in copied
    with serving(run) as (port, cid):
        out = complete(port)
        text = logs(cid)
    assert out["usage"]["completion_tokens"] == 4
    # Warm: the start added no file to the caches (lock files come and go).
    assert files(cache) == copied
    print(f"warm start: init engine {init_seconds(text)} s, 0 files added")
    # Nothing of kernelbake ran: the engine image has no kernelbake at all.
    assert "kernelbake serve:" not in text
    res = podman(
        "run",
        "--rm",
        *ULIMITS,
        "--entrypoint",
        "python3",
        published.engine,
        "-c",
        "import kernelbake",
        check=False,
    )
    assert res.returncode != 0

    # The control: the same pod with its cache directory left empty writes cache files to it.
    # Seen at the first one (a lock file aside, as on a warm start): the compile that follows
    # takes minutes on two cores and tells no more.
    cold = PodRun(spec, tmp_path / "cold", {"models": REPO / "images" / "models"})
    cid = podman(*cold.main_argv(["--shm-size", "1g"])[1:]).stdout.strip()
    try:
        added = first_cache_files(tmp_path / "cold" / "emptydir-kernelbake-cache", cid)
    finally:
        podman("rm", "-f", cid, check=False)
    print(f"cold start: wrote {added[0]} first")


def test_the_init_container_fallback_copies_with_mtimes_and_the_start_adds_no_file(
    published: Published, tmp_path: Path
) -> None:
    require_podman()
    spec = patched_pod(published, "init-container")
    assert not any("image" in v for v in spec["volumes"])  # for clusters without image volumes
    run = PodRun(spec, tmp_path, {"models": REPO / "images" / "models"})
    pull(published.engine)
    pull(spec["initContainers"][0]["image"])
    run.init_containers()
    seeded = tmp_path / "emptydir-kernelbake-cache"
    before = files(seeded)
    # The copy is the full image's cache root, mtimes kept. (Not compared with the artifact's:
    # BuildKit keys COPY layers by content, so a rebuild that compiles the same bytes may reuse
    # an earlier layer, with its mtimes, in one and not the other; the manifest, which holds
    # sizes and sha256, is the same: see the first test.)
    full = spec["initContainers"][0]["image"]
    listing = podman(
        "run", "--rm", *ULIMITS, "--entrypoint", "python3", full, "-c",
        "import json, pathlib; r = pathlib.Path('/opt/kernelbake/cache'); "
        "print(json.dumps({str(p.relative_to(r)): p.stat().st_mtime_ns for p in r.rglob('*') if p.is_file()}))",
    ).stdout  # fmt: skip
    assert before == json.loads(listing) and MANIFEST in before
    with serving(run) as (port, cid):
        out = complete(port)
        text = logs(cid)
    assert out["usage"]["completion_tokens"] == 4
    assert files(seeded) == before
    print(f"init-container start: init engine {init_seconds(text)} s, 0 files added")
