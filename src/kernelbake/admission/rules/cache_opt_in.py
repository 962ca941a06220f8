"""The cache opt-in: a pod annotated ``kernelbake.dev/cache-index: <the model's variant index>``
gets the index's cache artifact for its GPU, verified like an image and patched in pinned by
digest: an image volume that an init container running the pod's own engine image copies
(``cp -a``, mtimes kept) into an emptyDir at ``/opt/kernelbake/cache`` (default; the cache root
must be writable: Inductor takes lock files there on every start), or with
``kernelbake.dev/cache-mount: init-container`` an emptyDir that the model's full image of the
same key fills (``kernelbake seed-cache``, which keeps mtimes and checks every file against the
manifest), for clusters without image volumes. The engine container gets the engine variables
the artifact records, ``KERNELBAKE_MANIFEST_DIGEST`` and, when it sets neither command nor args,
the recorded command. Denied when the annotations cannot be read, the index does not verify or
has no artifact for every GPU the pod can land on, or the container does not fit the artifact
(as ``cache_volume`` judges a mounted one).
"""

from __future__ import annotations

from typing import Any

from kernelbake.admission.pod import Container
from kernelbake.admission.rules.cache_checks import (
    VerifiedArtifact,
    args_problems,
    engine_problems,
    env_problems,
    gpu_problems,
    verified_artifact,
)
from kernelbake.admission.rules.caches import (
    ARTIFACT_PATH,
    ARTIFACT_VOLUME,
    COPY_CONTAINER,
    OPT_IN,
    SEED_CONTAINER,
    SEED_PATH,
    VOLUME_NAME,
    CachePlan,
    chosen,
)
from kernelbake.admission.rules.facts import Facts, Rule
from kernelbake.admission.rules.shape import EMPTY, Denial, Verdict, append, verdict
from kernelbake.admission.subject import Accepted, IndexAccepted, Rejected, Unavailable
from kernelbake.admission.workloads import pointer
from kernelbake.contract.artifact import MANIFEST_DIGEST_ENV
from kernelbake.contract.layout import CACHE_ROOT
from kernelbake.contract.variants import Variant


def check(facts: Facts) -> Verdict:
    plan = facts.caches
    if plan is None:
        return EMPTY
    if plan.index is None:
        return verdict(plan.opt_in_problems)
    if any(isinstance(v, dict) and v.get("name") == VOLUME_NAME for v in facts.pod.spec.get("volumes") or []):
        # Patched already (an UPDATE, or the validating webhook after the mutating one): the
        # image volume is judged as any other; patching again would duplicate it.
        return verdict(plan.opt_in_problems, [f"{OPT_IN}: the pod has its {VOLUME_NAME} volume already"])
    if plan.opt_in_problems or plan.volume_problems:
        return verdict(plan.opt_in_problems)
    found = chosen(plan, facts.outcomes, facts.ways, facts.policy, facts.judge)
    if isinstance(found, Denial):
        return verdict([found])
    if found is None:
        return verdict([Denial(OPT_IN, f"{plan.index}: verification did not finish in time")])
    if not facts.mutate:
        return EMPTY
    return _opt_in(facts, plan, *found)


def _opt_in(facts: Facts, plan: CachePlan, variant: Variant, image: Variant | None) -> Verdict:
    """The artifact ``variant`` verified and fitted to the pod's container, and the patch that
    mounts it (``image``: the full image that seeds the caches in an init container)."""
    assert plan.index is not None
    container = next(c for c in facts.pod.of("containers") if c.index == plan.container)
    got = _artifact(facts, plan, variant)
    if isinstance(got, Denial):
        return verdict([got])
    text = f"the {variant.key.device} cache artifact of {plan.index}"
    problems, notes = gpu_problems(OPT_IN, text, got.key, facts.ways, facts.judge)
    problems += engine_problems(container.where, container.image, got)
    problems += env_problems(container.where, container.obj, got)
    given = bool(container.obj.get("command") or container.obj.get("args"))
    if given:
        problems += args_problems(container.where, container.obj, got)
    if problems:
        return verdict(problems, notes)
    seed_image = None
    if image is not None:
        seed = _seed(facts, plan, image, got)
        if isinstance(seed, Denial):
            return verdict([seed], notes)
        seed_image = seed
    patch = _patch(facts, container, got, f"{plan.index.written_name}@{variant.digest}", seed_image)
    if not given:
        patch.append(
            {"op": "add", "path": pointer((*container.at, "command")), "value": list(got.facts.command)}
        )
        notes.append(f"{container.where}: command set to the one the cache artifact was compiled for")
    return verdict((), notes, patch)


def _artifact(facts: Facts, plan: CachePlan, variant: Variant) -> VerifiedArtifact | Denial:
    """The cache artifact the index picked, as verified with the key the index claims for it."""
    assert plan.index is not None
    target = f"{plan.index.name}@{variant.digest}"
    text = f"the {variant.key.device} cache artifact of {plan.index}"
    artifact = facts.subjects.artifacts.get(target)
    if artifact is not None:
        got = verified_artifact(target, artifact)
        if got.key != variant.key:
            return Denial(
                OPT_IN,
                f"{text}: the index claims key {variant.key.digest}, the artifact verifies as {got.key.digest}",
            )
        return got
    outcome = facts.outcomes.get(target)
    if outcome is None:
        return Denial(OPT_IN, f"{text}: verification did not finish in time")
    if isinstance(outcome, Rejected):
        return Denial(OPT_IN, f"{text} was rejected: {outcome.reason}")
    if isinstance(outcome, Unavailable):
        return Denial(OPT_IN, f"{text} could not be verified: {outcome.reason}")
    if isinstance(outcome, IndexAccepted):
        return Denial(
            OPT_IN, f"{text} names a variant index; an image volume needs one cache artifact by digest"
        )
    return Denial(
        OPT_IN,
        f"{text} is a kernelbake image, not a cache artifact: an image volume takes the REPO:TAG-cache artifact",
    )


def _seed(facts: Facts, plan: CachePlan, image: Variant, got: VerifiedArtifact) -> str | Denial:
    """The full image of the artifact's key, pinned, that seeds the caches in an init container."""
    assert plan.index is not None
    target = f"{plan.index.name}@{image.digest}"
    seeded = facts.outcomes.get(target)
    if not isinstance(seeded, Accepted) or seeded.subject.key != got.key:
        reason = (
            seeded.reason
            if isinstance(seeded, Rejected | Unavailable)
            else "not verified as that key's image"
        )
        return Denial(f"the init container's image {target}", reason)
    return f"{plan.index.written_name}@{image.digest}"


def _patch(
    facts: Facts, container: Container, got: VerifiedArtifact, artifact: str, seed_image: str | None
) -> list[dict[str, Any]]:
    """The volumes, the init container and the engine container's mount and variables."""
    patch: list[dict[str, Any]] = []
    spec, base = facts.pod.spec, facts.pod.spec_path
    seed_mounts = [{"name": VOLUME_NAME, "mountPath": SEED_PATH}]
    if seed_image is None:
        # The artifact, read-only, copied by the engine image itself (cp -a keeps mtimes) into
        # the writable cache root: Inductor takes lock files under its cache directory on every
        # start, so a read-only mount at the cache root fails ("Read-only file system").
        source = {"reference": artifact, "pullPolicy": "IfNotPresent"}
        append(patch, spec, base, "volumes", {"name": ARTIFACT_VOLUME, "image": source})
        seed: dict[str, Any] = {
            "name": COPY_CONTAINER,
            "image": container.image,
            "command": ["cp", "-a", f"{ARTIFACT_PATH}/.", f"{SEED_PATH}/"],
            "volumeMounts": [
                {"name": ARTIFACT_VOLUME, "mountPath": ARTIFACT_PATH, "readOnly": True},
                *seed_mounts,
            ],
        }
    else:
        seed = {
            "name": SEED_CONTAINER,
            "image": seed_image,
            "command": ["python3", "-m", "kernelbake", "seed-cache", SEED_PATH],
            "volumeMounts": seed_mounts,
        }
    append(patch, spec, base, "volumes", {"name": VOLUME_NAME, "emptyDir": {}})
    append(patch, spec, base, "initContainers", seed)
    append(patch, container.obj, container.at, "volumeMounts", {"name": VOLUME_NAME, "mountPath": CACHE_ROOT})
    present = {e.get("name") for e in container.env}
    for name, value in [*got.facts.env, (MANIFEST_DIGEST_ENV, got.facts.manifest_digest)]:
        if name not in present:
            append(patch, container.obj, container.at, "env", {"name": name, "value": value})
            present.add(name)
    return patch


RULE = Rule(
    "cache-opt-in",
    "a pod annotated `kernelbake.dev/cache-index` whose annotations cannot be read (an index the policy "
    "does not govern, an unknown mount mode or container), whose index does not verify or has no cache "
    "artifact for every GPU the pod can land on (nor, for `init-container`, the same key's image), or "
    "whose container does not fit the artifact (its engine image, serve arguments, cache variables)",
    check,
)
