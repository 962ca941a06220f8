"""The pod's caches, as planned before any registry is asked: the opt-in annotation and the
governed image volumes (``contract.artifact``, ``contract.delta``).

1. **Opt-in.** A pod annotated ``kernelbake.dev/cache-index: <the model's variant index>`` gets
   the index's cache artifact for its GPU (``variants.pick`` with ``ArtifactKind.CACHE``, the
   ranking ``kernelbake resolve --cache-artifact`` prints), verified like an image and patched
   in pinned by digest (``rules.cache_opt_in``).
2. **Image volumes already in a pod** (``spec.volumes[].image.reference``) that name a governed
   repository: verified and pinned with the images (``rules.signature``); one that verifies as
   a cache artifact is judged by ``rules.cache_volume``, one that verifies as a cache delta by
   ``rules.delta``.

``admit.plan`` calls ``plan_caches``; ``service`` asks the gateway for ``next_cache_refs``
beside the GPU indexes' variants (``chosen``, as the opt-in rule picks); nothing here does I/O.

What no one checks on this path is stated in docs/guarantees.md's table ("Caches for a stock
vLLM image"): without kernelbake in the image nothing hashes the mounted files at start, and the
engine's own cache check is the only runtime one.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from kernelbake.admission import gpus
from kernelbake.admission.bounds import MAX_CACHE_VOLUMES, cap
from kernelbake.admission.gpus import admitted
from kernelbake.admission.pod import Container, Pod
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.references import ImageRef, InvalidReference, parse_reference
from kernelbake.admission.rules.shape import Denial
from kernelbake.admission.scheduling import Way
from kernelbake.admission.subject import IndexAccepted, Outcome, Rejected, Unavailable
from kernelbake.admission.variants import Pick, pick
from kernelbake.admission.workloads import MalformedObject, pod_spec, template_metadata
from kernelbake.contract.artifact import ArtifactKind
from kernelbake.contract.delta import DELTA_DIGEST_ENV
from kernelbake.contract.variants import Variant, is_gpu, of_kind

ANNOTATION_INDEX = "kernelbake.dev/cache-index"
ANNOTATION_MOUNT = "kernelbake.dev/cache-mount"
# Which container gets the caches (default: the first of spec.containers).
ANNOTATION_CONTAINER = "kernelbake.dev/cache-container"
VOLUME_NAME = "kernelbake-cache"
ARTIFACT_VOLUME = "kernelbake-cache-artifact"
ARTIFACT_PATH = "/kernelbake-artifact"
COPY_CONTAINER = "kernelbake-cache-copy"
SEED_CONTAINER = "kernelbake-cache-seed"
SEED_PATH = "/kernelbake-seed"
OPT_IN = f"annotation {ANNOTATION_INDEX}"


class MountMode(enum.Enum):
    """How the opt-in's artifact reaches the pod (annotation ``kernelbake.dev/cache-mount``)."""

    IMAGE_VOLUME = "image-volume"
    INIT_CONTAINER = "init-container"


@dataclasses.dataclass(frozen=True)
class CacheVolume:
    """An image volume of the pod that names a governed repository."""

    index: int
    name: str
    ref: ImageRef
    # Containers that mount it, init containers too (the copy).
    mounted_by: tuple[Container, ...]

    @property
    def target(self) -> str:
        return self.ref.target


@dataclasses.dataclass(frozen=True)
class CachePlan:
    """The pod's caches as planned from the pod spec alone: the opt-in, the governed volumes, problems."""

    # The opt-in: the variant index to take the artifact from, and how to mount it.
    index: ImageRef | None = None
    mode: MountMode = MountMode.IMAGE_VOLUME
    container: int = 0
    volumes: tuple[CacheVolume, ...] = ()
    # What is wrong with the annotations, and with the governed volumes' references.
    opt_in_problems: tuple[Denial, ...] = ()
    volume_problems: tuple[Denial, ...] = ()

    def opt_in_refs(self) -> dict[str, ImageRef]:
        """The opt-in's variant index alone (the webhook verifies image volumes as images)."""
        return {} if self.index is None else {self.index.target: self.index}


def plan_caches(pod: Pod, metadata: Any, policy: AdmissionPolicy) -> CachePlan | None:
    """None when the pod neither opts in, mounts a governed image volume nor sets a delta's pin
    (nothing to do). ``metadata``: the object's metadata, where the annotations are (the pod
    template's for a workload: pass ``spec.template.metadata``)."""
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    annotations = annotations if isinstance(annotations, dict) else {}
    index, mode, container, opt_in = _opt_in(pod, annotations, policy)
    volumes: list[CacheVolume] = []
    problems: list[Denial] = []
    users = _users(pod) if pod.image_volumes else {}
    for volume in pod.image_volumes:
        ref, problem = _governed_ref(volume.image, volume.where, policy)
        if problem:
            problems.append(problem)
        if ref is not None:
            volumes.append(CacheVolume(volume.index, volume.name, ref, tuple(users.get(volume.name, ()))))
    # Each is checked against every container that uses the caches (volumes times containers).
    cap("the pod's image volumes naming governed repositories", volumes, MAX_CACHE_VOLUMES)
    if (
        annotations.get(ANNOTATION_INDEX) is None
        and not (volumes or problems or opt_in)
        and not _pins_delta(pod)
    ):
        return None
    return CachePlan(index, mode, container, tuple(volumes), tuple(opt_in), tuple(problems))


def _opt_in(
    pod: Pod, annotations: Mapping[str, Any], policy: AdmissionPolicy
) -> tuple[ImageRef | None, MountMode, int, list[Denial]]:
    """(the index, the mount mode, the container's index, what is wrong) of the annotations."""
    problems: list[Denial] = []
    index: ImageRef | None = None
    mode = MountMode.IMAGE_VOLUME
    raw_index = annotations.get(ANNOTATION_INDEX)
    if raw_index is not None:
        index, problem = _governed_ref(raw_index, OPT_IN, policy, required=True)
        problems += [problem] if problem else []
        raw_mode = annotations.get(ANNOTATION_MOUNT, MountMode.IMAGE_VOLUME.value)
        try:
            mode = MountMode(raw_mode)
        except ValueError:
            choices = ", ".join(m.value for m in MountMode)
            problems.append(Denial(f"annotation {ANNOTATION_MOUNT}", f"{raw_mode!r} is not one of {choices}"))
    container = 0
    wanted = annotations.get(ANNOTATION_CONTAINER)
    if wanted is None and raw_index is None:
        # No opt-in annotation (most pods): the names would not be read.
        return index, mode, container, problems
    names = [c.obj.get("name") for c in pod.of("containers")]
    if wanted is not None:
        if wanted not in names:
            problems.append(
                Denial(f"annotation {ANNOTATION_CONTAINER}", f"the pod has no container {wanted!r}")
            )
        else:
            container = names.index(wanted)
    if raw_index is not None and not names:
        problems.append(Denial(OPT_IN, "the pod has no container to give the caches to"))
    return index, mode, container, problems


def _pins_delta(pod: Pod) -> bool:
    """Whether a container sets ``$KERNELBAKE_DELTA_DIGEST``: a pod that does is reviewed for its
    deltas (``rules.delta``) even with no other cache to judge."""
    for c in pod.containers:
        for e in c.env:
            if e.get("name") == DELTA_DIGEST_ENV:
                return True
    return False


def _users(pod: Pod) -> dict[str, list[Container]]:
    """Volume name → the (init) containers that mount it, in one pass over the mounts."""
    users: dict[str, list[Container]] = {}
    for c in pod.of("initContainers", "containers"):
        for name in {m.name for m in c.mounts if m.name is not None}:
            users.setdefault(name, []).append(c)
    return users


def opt_in_of(kind: Any, obj: Any) -> tuple[Any, ...]:
    """The cache annotations of ``obj``'s pod (template), to tell whether an UPDATE changed the
    opt-in even where the pod spec stayed the same."""
    try:
        found = pod_spec(kind, obj)
    except MalformedObject:
        return ()
    if found is None:
        return ()
    metadata = template_metadata(obj, found[0])
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return ()
    return tuple(annotations.get(a) for a in (ANNOTATION_INDEX, ANNOTATION_MOUNT, ANNOTATION_CONTAINER))


def _governed_ref(
    text: Any, where: str, policy: AdmissionPolicy, *, required: bool = False
) -> tuple[ImageRef | None, Denial | None]:
    """(the reference when the policy governs it, a problem when it cannot be read, or when it
    is ``required`` to be governed and is not)."""
    if not isinstance(text, str):
        return None, Denial(where, "the reference must be a string")
    try:
        ref = parse_reference(text)
    except InvalidReference as exc:
        return None, Denial(where, str(exc))
    if not policy.governs(ref.name):
        # An opt-in naming an index this policy does not govern could not be verified.
        return None, Denial(
            where, f"{ref.name} is not a repository this policy governs"
        ) if required else None
    if ref.tag is None and ref.digest is None:
        return None, Denial(where, f"{text} has no tag or digest")
    return ref, None


def next_cache_refs(
    plan: CachePlan,
    outcomes: Mapping[str, Outcome],
    ways: Sequence[Way],
    policy: AdmissionPolicy,
    judge: gpus.Judge,
) -> dict[str, ImageRef]:
    """What to verify once the index's verdict is in: the cache artifact its GPU picks and, for
    an init container, the full image of the same key."""
    found = chosen(plan, outcomes, ways, policy, judge)
    if found is None or isinstance(found, Denial) or plan.index is None:
        return {}
    artifact, image = found
    refs = {f"{plan.index.name}@{artifact.digest}": plan.index}
    if image is not None:
        refs[f"{plan.index.name}@{image.digest}"] = plan.index
    return {t: parse_reference(t) for t in refs}


def chosen(
    plan: CachePlan,
    outcomes: Mapping[str, Outcome],
    ways: Sequence[Way],
    policy: AdmissionPolicy,
    judge: gpus.Judge,
) -> tuple[Variant, Variant | None] | Denial | None:
    """(cache artifact, the same key's image for an init container) the index picks, why none,
    or None while the index has no verdict."""
    if plan.index is None:
        return None
    outcome = outcomes.get(plan.index.target)
    if outcome is None:
        return None
    if isinstance(outcome, Rejected):
        return Denial(OPT_IN, f"{plan.index} was rejected: {outcome.reason}")
    if isinstance(outcome, Unavailable):
        return Denial(OPT_IN, f"{plan.index} could not be verified: {outcome.reason}")
    if not isinstance(outcome, IndexAccepted):
        return Denial(OPT_IN, f"{plan.index} is one image, not a model's variant index")
    variants = outcome.index.variants
    cpu = [v for v in of_kind(variants, ArtifactKind.CACHE) if not is_gpu(v.key)]
    if cpu and ways and not any(admitted(w, judge.catalogue).pins_gpu for w in ways):
        # A pod that asks for no GPU runs the CPU build: its caches, when the model has them.
        picked = Pick(cpu[0])
    else:
        picked = pick(variants, ways, judge.catalogue, policy.gpu_match, ArtifactKind.CACHE)
    if picked.variant is None:
        return Denial(OPT_IN, "; ".join(picked.problems), picked.hint)
    if plan.mode is not MountMode.INIT_CONTAINER:
        return picked.variant, None
    key = picked.variant.key
    image = next((v for v in variants if v.kind is ArtifactKind.IMAGE and v.key == key), None)
    if image is None:
        return Denial(
            f"annotation {ANNOTATION_MOUNT}",
            f"{MountMode.INIT_CONTAINER.value} copies the caches with the model's full image, and "
            f"{plan.index} lists none with key {key.digest}",
            f"publish it (kernelbake build --publish both) or use {MountMode.IMAGE_VOLUME.value}",
        )
    return picked.variant, image
