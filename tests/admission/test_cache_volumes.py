"""Cache artifacts at admission (admission/rules: caches, cache_opt_in, cache_volume), pure: the
opt-in annotation is resolved for the pod's GPU and patched in as the recipes in deploy/stock-vllm
spell out, and image volumes already in a pod are verified, pinned and checked against the pod's
GPU, engine image, serve arguments and env. Verification outcomes are given, as the gateway would
give them, and every rule runs on them as the webhook runs them."""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import jsonpatch
import pytest
import yaml

from kernelbake.admission import gpus
from kernelbake.admission.bounds import UNBOUNDED
from kernelbake.admission.pod import walk
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.rules import judge as run_rules
from kernelbake.admission.rules import trusted_paths
from kernelbake.admission.rules.caches import (
    ANNOTATION_INDEX,
    ANNOTATION_MOUNT,
    CachePlan,
    next_cache_refs,
    plan_caches,
)
from kernelbake.admission.rules.facts import Facts, Planned
from kernelbake.admission.rules.image_volume import UNJUDGED
from kernelbake.admission.rules.reference import govern
from kernelbake.admission.rules.shape import Verdict
from kernelbake.admission.scheduling import ways
from kernelbake.admission.subject import (
    Accepted,
    CacheArtifact,
    Image,
    IndexAccepted,
    Outcome,
    Rejected,
    Subject,
    VerifiedIndex,
)
from kernelbake.admission.variants import Picker
from kernelbake.catalogue import load_catalogue
from kernelbake.contract.artifact import ArtifactKind, CacheArtifactFacts, EngineImage
from kernelbake.contract.key import CacheKey
from kernelbake.contract.variants import Variant
from kernelbake.gfd import PRODUCT
from kernelbake.oci.types import OCI_MANIFEST
from kernelbake.plan import plan as plan_targets
from kernelbake.spec import load_spec
from tests.admission import documents
from tests.admission.documents import H100
from tests.admission.fakes import REPO, FakeVerified, digest_of, make_policy
from tests.conftest import REPO as SOURCE_TREE

RECIPES = SOURCE_TREE / "deploy" / "stock-vllm"
SPEC_PATH = ("spec", "template", "spec")


def recipe(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((RECIPES / name).read_text())
    return doc


def facts_of(deployment: Mapping[str, Any]) -> tuple[CacheArtifactFacts, str, str]:
    """The artifact facts image-volume.yaml was written from: (facts, artifact, engine image)."""
    spec = deployment["spec"]["template"]["spec"]
    c = spec["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    manifest = env.pop("KERNELBAKE_MANIFEST_DIGEST")
    artifact = next(v for v in spec["volumes"] if "image" in v)["image"]["reference"]
    engine_name, engine_digest = c["image"].split("@")
    facts = CacheArtifactFacts(
        engine=EngineImage(
            name=engine_name + ":0.32.0", config_digest="sha256:" + "5" * 64, digest=engine_digest
        ),
        manifest_digest=manifest,
        command=tuple(c["command"]),
        env=tuple(sorted(env.items())),
    )
    return facts, artifact, c["image"]


@dataclasses.dataclass(frozen=True)
class Verified(FakeVerified):
    artifact: CacheArtifactFacts | None = None


def subject(verified: Verified) -> Subject:
    """What the real verifier makes of it: a cache artifact where its labels carry the facts."""
    return Image(verified) if verified.artifact is None else CacheArtifact(verified, verified.artifact)


@pytest.fixture
def policy() -> AdmissionPolicy:
    return make_policy(images=["registry.example.com/kb/**", f"{REPO.split('/')[0]}/kernelbake/**"])


@pytest.fixture
def judge(policy: AdmissionPolicy) -> gpus.Judge:
    return gpus.Judge(load_catalogue(), policy.gpu_match)


def cpu_key(keys: dict[str, CacheKey]) -> CacheKey:
    """tiny-llama's CPU key: the model and serve arguments the recipes run."""
    (target,) = plan_targets(load_spec(SOURCE_TREE / "images" / "tiny-llama.yaml"), ["cpu"], registry="r")
    return target.key


def opt_in(
    mode: str | None = None, *, index: str = "registry.example.com/kb/tiny-llama:vllm0.32.0-gpus-0a1b2c3d"
) -> dict[str, Any]:
    doc = recipe("opt-in.yaml")
    annotations = doc["spec"]["template"]["metadata"]["annotations"]
    annotations[ANNOTATION_INDEX] = index
    if mode:
        annotations[ANNOTATION_MOUNT] = mode
    doc["spec"]["template"]["spec"]["containers"][0]["image"] = facts_of(recipe("image-volume.yaml"))[2]
    return doc


def planned(doc: Mapping[str, Any], policy: AdmissionPolicy) -> CachePlan:
    found = plan_caches(
        walk(SPEC_PATH, doc["spec"]["template"]["spec"]), doc["spec"]["template"]["metadata"], policy
    )
    assert found is not None
    return found


def targets(plan: CachePlan) -> set[str]:
    """What the gateway verifies first for the caches: the index and every governed volume."""
    return {*plan.opt_in_refs(), *(v.target for v in plan.volumes)}


def problems(plan: CachePlan) -> list[str]:
    return [str(d) for d in (*plan.opt_in_problems, *plan.volume_problems)]


def outcomes_for(
    plan: CachePlan, key: CacheKey, facts: CacheArtifactFacts, *, image_too: bool = False
) -> dict[str, Outcome]:
    """The gateway's verdicts: the index lists the artifact (and the same key's image)."""
    assert plan.index is not None
    art_digest = "sha256:" + "2" * 64
    img_digest = "sha256:" + "4" * 64
    variants = [Variant(key=key, digest=art_digest, size=1, media_type=OCI_MANIFEST, kind=ArtifactKind.CACHE)]
    if image_too:
        variants.append(Variant(key=key, digest=img_digest, size=1, media_type=OCI_MANIFEST))
    name = plan.index.name
    out: dict[str, Outcome] = {
        str(plan.index): IndexAccepted(VerifiedIndex(digest_of("index"), "ci", tuple(variants))),
        f"{name}@{art_digest}": Accepted(
            subject(Verified(name, name, art_digest, key, facts.manifest_digest, "ci", {}, facts))
        ),
    }
    if image_too:
        out[f"{name}@{img_digest}"] = Accepted(
            subject(Verified(name, name, img_digest, key, facts.manifest_digest, "ci", {}))
        )
    return out


def decided(
    plan: CachePlan,
    outcomes: Mapping[str, Outcome],
    spec: Mapping[str, Any],
    policy: AdmissionPolicy,
    judge: gpus.Judge,
) -> Verdict:
    """Every rule as the mutating endpoint runs them on the pod ``spec``, with the caches
    ``plan`` found and the gateway's verdicts ``outcomes``."""
    pod = walk(SPEC_PATH, spec)
    governing = govern(list(pod.sites()), {}, policy, UNBOUNDED)
    facts = Facts.of(
        pod=pod,
        ways=tuple(ways(spec)),
        governed=governing.governed,
        planned=Planned(governing.found, trusted_paths.find(g.site for g in governing.governed)),
        caches=plan,
        outcomes=outcomes,
        policy=policy,
        judge=judge,
        picker=Picker(judge.catalogue, policy.gpu_match),
        mutate=True,
        budget=UNBOUNDED,
    )
    return run_rules(facts)


def opt_in_decision(
    doc: dict[str, Any], key: CacheKey, facts: CacheArtifactFacts, policy: AdmissionPolicy, judge: gpus.Judge
) -> Verdict:
    """The decision on the opt-in ``doc`` when its index lists the artifact of ``facts`` for ``key``."""
    plan = planned(doc, policy)
    return decided(plan, outcomes_for(plan, key, facts), doc["spec"]["template"]["spec"], policy, judge)


def patched(
    doc: dict[str, Any],
    plan: CachePlan,
    outcomes: Mapping[str, Outcome],
    policy: AdmissionPolicy,
    judge: gpus.Judge,
) -> dict[str, Any]:
    spec = doc["spec"]["template"]["spec"]
    decision = decided(plan, outcomes, spec, policy, judge)
    assert decision.problems == ()
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(doc), list(decision.patch))
    return result


def test_the_opt_in_is_patched_into_exactly_the_image_volume_recipe(
    keys: dict[str, CacheKey], policy: AdmissionPolicy, judge: gpus.Judge
) -> None:
    facts, _, _ = facts_of(recipe("image-volume.yaml"))
    doc = opt_in()
    plan = planned(doc, policy)
    outcomes = outcomes_for(plan, cpu_key(keys), facts)
    # First round: the index; second: the artifact its pick names.
    assert targets(plan) == {str(plan.index)}
    assert set(
        next_cache_refs(plan, outcomes, tuple(ways(doc["spec"]["template"]["spec"])), policy, judge)
    ) == {f"registry.example.com/kb/tiny-llama@sha256:{'2' * 64}"}
    got = patched(doc, plan, outcomes, policy, judge)
    want = recipe("image-volume.yaml")
    got["spec"]["template"]["metadata"].pop("annotations")
    assert got == want


@pytest.mark.parametrize(
    ("volumes", "message"),
    [
        ("not a list", "volumes must be a list"),
        (["not an object"], "volumes[0] must be an object"),
        ([{"name": "c", "image": "not an object"}], '("c").image must be an object'),
        ([{"name": "c", "image": {"reference": 7}}], '("c").image.reference must be a string'),
    ],
)
def test_the_cache_plan_reads_volumes_as_the_image_volume_review_does(
    policy: AdmissionPolicy, volumes: Any, message: str
) -> None:
    # One reading of spec.volumes (volumes.image_volumes): a shape the review refuses is not
    # skipped silently by the cache plan.
    from kernelbake.admission.workloads import MalformedObject

    doc = opt_in()
    doc["spec"]["template"]["spec"]["volumes"] = volumes
    with pytest.raises(MalformedObject, match=re.escape(message)):
        planned(doc, policy)


def test_the_init_container_opt_in_is_the_init_container_recipe(
    keys: dict[str, CacheKey], policy: AdmissionPolicy, judge: gpus.Judge
) -> None:
    facts, _, _ = facts_of(recipe("image-volume.yaml"))
    doc = opt_in("init-container")
    plan = planned(doc, policy)
    outcomes = outcomes_for(plan, cpu_key(keys), facts, image_too=True)
    spec_ways = tuple(ways(doc["spec"]["template"]["spec"]))
    assert len(next_cache_refs(plan, outcomes, spec_ways, policy, judge)) == 2
    got = patched(doc, plan, outcomes, policy, judge)
    got["spec"]["template"]["metadata"].pop("annotations")
    assert got == recipe("init-container.yaml")


def test_an_init_container_without_the_same_keys_image_in_the_index_is_refused(
    keys: dict[str, CacheKey], policy: AdmissionPolicy, judge: gpus.Judge
) -> None:
    facts, _, _ = facts_of(recipe("image-volume.yaml"))
    doc = opt_in("init-container")
    decision = opt_in_decision(doc, cpu_key(keys), facts, policy, judge)
    assert decision.patch == ()
    assert "--publish both" in decision.problems[0]


def test_a_gpu_pod_gets_its_gpus_artifact_and_a_pod_for_another_gpu_is_refused(
    keys: dict[str, CacheKey], policy: AdmissionPolicy, judge: gpus.Judge
) -> None:
    facts, _, _ = facts_of(recipe("image-volume.yaml"))
    doc = opt_in()
    spec = doc["spec"]["template"]["spec"]
    spec["nodeSelector"] = {PRODUCT: H100}
    plan = planned(doc, policy)
    got = patched(doc, plan, outcomes_for(plan, keys["h100"], facts), policy, judge)
    artifact = next(v for v in got["spec"]["template"]["spec"]["volumes"] if "image" in v)
    assert artifact["image"]["reference"].endswith("2" * 64)
    # Only an A100 artifact in the index: the H100 pod gets nothing and is told why.
    decision = decided(plan, outcomes_for(plan, keys["a100-80gb"], facts), spec, policy, judge)
    assert decision.patch == () and "no variant fits" in decision.problems[0]


def test_an_engine_image_other_than_the_one_compiled_in_is_refused(
    keys: dict[str, CacheKey], policy: AdmissionPolicy, judge: gpus.Judge
) -> None:
    facts, _, _ = facts_of(recipe("image-volume.yaml"))
    doc = opt_in()
    doc["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example.com/engine/vllm-cpu:latest"
    decision = opt_in_decision(doc, cpu_key(keys), facts, policy, judge)
    assert decision.patch == ()
    assert "were compiled in registry.example.com/engine/vllm-cpu:0.32.0@sha256:1111" in decision.problems[0]


def test_an_artifact_built_from_a_local_engine_image_cannot_be_matched_and_is_refused(
    keys: dict[str, CacheKey], policy: AdmissionPolicy, judge: gpus.Judge
) -> None:
    facts, _, _ = facts_of(recipe("image-volume.yaml"))
    local = dataclasses.replace(facts, engine=dataclasses.replace(facts.engine, digest=None))
    doc = opt_in()
    decision = opt_in_decision(doc, cpu_key(keys), local, policy, judge)
    assert "by config digest" in decision.problems[0]


def test_an_image_volume_in_the_pod_is_verified_pinned_and_its_users_checked(
    keys: dict[str, CacheKey], policy: AdmissionPolicy, judge: gpus.Judge
) -> None:
    facts, artifact, _ = facts_of(recipe("image-volume.yaml"))
    doc = recipe("image-volume.yaml")
    spec = doc["spec"]["template"]["spec"]
    spec["volumes"][1]["image"]["reference"] = "registry.example.com/kb/tiny-llama:cpu-cache"
    plan = planned(doc, policy)
    assert plan.index is None and targets(plan) == {"registry.example.com/kb/tiny-llama:cpu-cache"}
    name = "registry.example.com/kb/tiny-llama"
    digest = artifact.split("@")[1]
    ok = {
        "registry.example.com/kb/tiny-llama:cpu-cache": Accepted(
            subject(Verified(name, name, digest, cpu_key(keys), facts.manifest_digest, "ci", {}, facts))
        )
    }
    decision = decided(plan, ok, spec, policy, judge)
    assert decision.problems == ()
    assert decision.patch == (
        {"op": "replace", "path": "/spec/template/spec/volumes/1/image/reference", "value": artifact},
    )
    # The serve arguments the key records: another max-model-len is refused.
    c = spec["containers"][0]
    c["command"] = [("4096" if a == "2048" else a) for a in c["command"]]
    decision = decided(plan, ok, spec, policy, judge)
    assert "--max-model-len 4096 (key: 2048)" in decision.problems[0]
    # A cache variable pointing elsewhere is refused.
    c["command"] = facts.command
    next(e for e in c["env"] if e["name"] == "TORCHINDUCTOR_CACHE_DIR")["value"] = "/tmp/inductor"
    decision = decided(plan, ok, spec, policy, judge)
    assert "TORCHINDUCTOR_CACHE_DIR='/tmp/inductor'" in decision.problems[0]


@pytest.mark.parametrize(
    ("mount_path", "checked"),
    [
        ("/opt/kernelbake/cache", True),
        # The same directory as the container resolves it: each escaped the check as written.
        ("/opt/kernelbake/cache/", True),
        ("/opt//kernelbake/./cache", True),
        ("/opt/kernelbake/x/../cache", True),
        ("opt/kernelbake/cache", True),
        # Part of the caches (Inductor's) is the engine running on them too.
        ("/opt/kernelbake/cache/inductor", True),
        # Not the cache root: a sibling whose name only starts the same.
        ("/opt/kernelbake/cache-old", False),
    ],
)
def test_an_engine_container_at_the_cache_root_is_checked_however_its_mount_path_is_spelled(
    keys: dict[str, CacheKey], policy: AdmissionPolicy, judge: gpus.Judge, mount_path: str, checked: bool
) -> None:
    """The engine container of image-volume.yaml mounts the emptyDir the artifact is copied to,
    not the artifact: it is checked because it mounts something at the cache root."""
    facts, _, _ = facts_of(recipe("image-volume.yaml"))
    doc = recipe("image-volume.yaml")
    spec = doc["spec"]["template"]["spec"]
    c = spec["containers"][0]
    next(m for m in c["volumeMounts"] if m["name"] == "kernelbake-cache")["mountPath"] = mount_path
    c["command"] = [("4096" if a == "2048" else a) for a in c["command"]]
    plan = planned(doc, policy)
    (target,) = targets(plan)
    name, digest = target.split("@")
    ok = {
        target: Accepted(
            subject(Verified(name, name, digest, cpu_key(keys), facts.manifest_digest, "ci", {}, facts))
        )
    }
    decision = decided(plan, ok, spec, policy, judge)
    if checked:
        assert len(decision.problems) == 1 and "--max-model-len 4096 (key: 2048)" in decision.problems[0]
    else:
        assert decision.problems == ()


def test_an_image_volume_naming_a_kernelbake_image_is_not_judged_as_caches_and_an_unsigned_one_is_refused(
    keys: dict[str, CacheKey], policy: AdmissionPolicy, judge: gpus.Judge
) -> None:
    """As the webhook answers (docs/image-volumes.md's table): a whole image as a volume is
    verified and pinned, with the warning that its fit is not judged; an unsigned one is denied
    by the signature rule, and nothing is pinned."""
    doc = recipe("image-volume.yaml")
    spec = doc["spec"]["template"]["spec"]
    plan = planned(doc, policy)
    (target,) = targets(plan)
    name = target.split("@")[0]
    image = {
        target: Accepted(
            subject(Verified(name, name, target.split("@")[1], cpu_key(keys), "sha256:" + "3" * 64, "ci", {}))
        )
    }
    decision = decided(plan, image, spec, policy, judge)
    assert decision.problems == ()
    assert [n for n in decision.notes if "not judged for image volumes" in n] == [
        f'image volume "kernelbake-cache-artifact": image {target}: {UNJUDGED}'
    ]
    unsigned = {target: Rejected("no signature from a trusted identity")}
    decision = decided(plan, unsigned, spec, policy, judge)
    assert decision.problems == (
        f'image volume "kernelbake-cache-artifact": image {target} was rejected: no signature from a '
        "trusted identity",
    )
    assert decision.patch == ()


def test_pods_without_the_annotation_or_governed_volumes_are_left_alone(policy: AdmissionPolicy) -> None:
    doc = recipe("opt-in.yaml")
    doc["spec"]["template"]["metadata"].pop("annotations")
    assert (
        plan_caches(
            walk(SPEC_PATH, doc["spec"]["template"]["spec"]), doc["spec"]["template"]["metadata"], policy
        )
        is None
    )


def test_bad_annotations_are_problems_not_tracebacks(policy: AdmissionPolicy) -> None:
    for index, mode, expect in [
        ("not a reference!", None, "annotation kernelbake.dev/cache-index"),
        ("docker.io/library/ubuntu:22.04", None, "not a repository this policy governs"),
        ("registry.example.com/kb/tiny-llama:x", "tmpfs", "is not one of image-volume, init-container"),
    ]:
        plan = planned(opt_in(mode, index=index), policy)
        assert any(expect in p for p in problems(plan)), problems(plan)


def test_a_pod_patched_already_is_checked_not_patched_twice(
    keys: dict[str, CacheKey], policy: AdmissionPolicy, judge: gpus.Judge
) -> None:
    facts, _, _ = facts_of(recipe("image-volume.yaml"))
    doc = opt_in()
    first = planned(doc, policy)
    outcomes = outcomes_for(first, cpu_key(keys), facts)
    once = patched(doc, first, outcomes, policy, judge)
    again = planned(once, policy)
    assert len(again.volumes) == 1  # the patched-in image volume, checked as any other
    decision = decided(again, outcomes, once["spec"]["template"]["spec"], policy, judge)
    assert decision.problems == () and decision.patch == ()


# -- through the webhook's Admitter: plan, the gateway's two rounds, decide ---------------------


class _ArtifactVerifier:
    """The gateway's verifier for the opt-in recipe: the index, then the artifact it lists."""

    def __init__(self, index_ref: str, key: CacheKey, facts: CacheArtifactFacts) -> None:
        self.name = index_ref.split(":")[0] if "@" not in index_ref else index_ref.split("@")[0]
        self.index_digest = digest_of("index")
        self.art_digest = "sha256:" + "2" * 64
        self.key, self.facts = key, facts
        self.calls: list[str] = []

    def __call__(self, reference: str) -> Any:
        self.calls.append(reference)
        if reference.endswith("@" + self.art_digest):
            name = reference.split("@")[0]
            return subject(
                Verified(
                    name, name, self.art_digest, self.key, self.facts.manifest_digest, "ci", {}, self.facts
                )
            )
        if reference.startswith(self.name):
            variant = Variant(
                key=self.key, digest=self.art_digest, size=1, media_type=OCI_MANIFEST, kind=ArtifactKind.CACHE
            )
            return VerifiedIndex(self.index_digest, "ci", (variant,))
        from kernelbake.admission.gateway import ImageRejected

        raise ImageRejected(f"{reference} has no signature from a trusted identity")


def _review(admitter: Any, doc: dict[str, Any], endpoint: Any) -> dict[str, Any]:
    review = documents.review_of(doc)
    answer: dict[str, Any] = admitter.review(review, endpoint)
    return answer["response"]


def test_the_webhook_patches_the_opt_in_and_validates_the_result(
    keys: dict[str, CacheKey], policy: AdmissionPolicy
) -> None:
    import base64
    import json

    from kernelbake.admission.admit import Endpoint
    from tests.admission.fakes import make_admitter

    facts, _, _ = facts_of(recipe("image-volume.yaml"))
    doc = opt_in()
    verifier = _ArtifactVerifier(
        doc["spec"]["template"]["metadata"]["annotations"][ANNOTATION_INDEX], cpu_key(keys), facts
    )
    admitter = make_admitter(verifier, policy)
    try:
        response = _review(admitter, copy.deepcopy(doc), Endpoint.MUTATE)
        assert response["allowed"] is True, response
        patch = json.loads(base64.b64decode(response["patch"]))
        got = jsonpatch.apply_patch(copy.deepcopy(doc), patch)
        spec = got["spec"]["template"]["spec"]
        artifact = next(v for v in spec["volumes"] if "image" in v)["image"]["reference"]
        assert artifact.endswith("@" + verifier.art_digest)
        env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
        assert env["KERNELBAKE_MANIFEST_DIGEST"] == facts.manifest_digest
        # Both rounds ran: the index, then the artifact its GPU pick named.
        assert any(c.endswith("@" + verifier.art_digest) for c in verifier.calls)
        # The patched pod passes the validating webhook: its image volume is now a governed,
        # pinned artifact, checked against the engine container and not patched again.
        validated = _review(admitter, got, Endpoint.VALIDATE)
        assert validated["allowed"] is True, validated
        assert not any("not judged for image volumes" in w for w in validated.get("warnings", []))
    finally:
        admitter.gateway.close()


def test_the_webhook_denies_an_image_volume_artifact_for_another_engine_image(
    keys: dict[str, CacheKey], policy: AdmissionPolicy
) -> None:
    from kernelbake.admission.admit import Endpoint
    from tests.admission.fakes import make_admitter

    facts, _, _ = facts_of(recipe("image-volume.yaml"))
    doc = recipe("image-volume.yaml")
    spec = doc["spec"]["template"]["spec"]
    verifier = _ArtifactVerifier(
        next(v for v in spec["volumes"] if "image" in v)["image"]["reference"], cpu_key(keys), facts
    )
    verifier.art_digest = next(v for v in spec["volumes"] if "image" in v)["image"]["reference"].split("@")[1]
    admitter = make_admitter(verifier, policy)
    try:
        assert _review(admitter, copy.deepcopy(doc), Endpoint.VALIDATE)["allowed"] is True
        other = copy.deepcopy(doc)
        for c in (
            *other["spec"]["template"]["spec"]["containers"],
            *other["spec"]["template"]["spec"].get("initContainers", []),
        ):
            c["image"] = c["image"].split("@")[0] + "@sha256:" + "9" * 64
        denied = _review(admitter, other, Endpoint.VALIDATE)
        assert denied["allowed"] is False
        assert "run that image pinned by digest" in denied["status"]["message"]
    finally:
        admitter.gateway.close()
