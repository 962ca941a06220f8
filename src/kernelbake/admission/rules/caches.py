"""Cache artifacts for pods that run the unchanged engine image (``contract.artifact``).

Two things, both in the same three pure steps as ``admit`` (plan → the gateway verifies →
decide), so that review wires them in beside the images:

1. **Opt-in.** A pod annotated ``kernelbake.dev/cache-index: <the model's variant index>`` gets
   the index's cache artifact for its GPU (``variants.pick`` with ``ArtifactKind.CACHE``, the
   ranking ``kernelbake resolve --cache-artifact`` prints), verified like an image, patched in
   pinned by digest: an image volume that an init container running the pod's own engine image
   copies (``cp -a``, mtimes kept) into an emptyDir at ``/opt/kernelbake/cache`` (default; the
   cache root must be writable: Inductor takes lock files there on every start), or with
   ``kernelbake.dev/cache-mount: init-container`` an emptyDir that the model's full image of
   the same key fills (``kernelbake seed-cache``, which keeps mtimes and checks every file
   against the manifest), for clusters without image volumes. The engine container gets the engine variables the artifact records,
   ``KERNELBAKE_MANIFEST_DIGEST`` and, when it sets neither command nor args, the recorded command.
2. **Image volumes already in a pod** (``spec.volumes[].image.reference``) that name a governed
   repository: verified and pinned by the image review (``admit``), which denies one that is
   unsigned or unresolvable. One that verifies as a cache artifact is then judged here: its
   key against every GPU the pod can land on, and each container that mounts it (or anything
   at or under the cache root) checked: it must run the engine image the caches were compiled
   in (by manifest digest), and its serve arguments, when it gives any, must be the ones the key
   records. One that verifies as a kernelbake image (or a GPU index's image variant) is no cache
   artifact and not judged here: the webhook admits it, pinned, with the warning
   ``volumes.UNJUDGED`` that its fit is not judged (docs/image-volumes.md's table). Why not
   refuse it: its signature and digest are checked, so nothing unsigned runs; what its files are
   for is the pod's (a kernelbake image's root is no cache root, so mounted there its caches are
   not where the engine looks); the warning says where the guarantee ends. Without the image
   review beside it (``decide_caches(verified_elsewhere=False)``), such a volume is a problem.

``admit.plan`` calls ``plan_caches``, ``service`` asks the gateway for ``next_cache_refs`` beside
the GPU indexes' variants, and ``admit.decide`` merges ``decide_caches``; nothing here does I/O.

What no one checks on this path is stated in docs/guarantees.md's table ("Caches for a stock
vLLM image"): without kernelbake in the image nothing hashes the mounted files at start, and the
engine's own cache check is the only runtime one.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kernelbake.admission import gpus
from kernelbake.admission.bounds import MAX_CACHE_VOLUMES, MAX_PROBLEMS, UNBOUNDED, Budget, cap, stopped
from kernelbake.admission.gateway import Accepted, IndexAccepted, Outcome, Rejected, Unavailable
from kernelbake.admission.gpus import admitted
from kernelbake.admission.policy import AdmissionPolicy
from kernelbake.admission.references import ImageRef, InvalidReference, parse_reference
from kernelbake.admission.rules.cache_checks import (
    VerifiedArtifact,
    args_problems,
    engine_problems,
    env_problems,
)
from kernelbake.admission.rules.trusted_paths import normal
from kernelbake.admission.scheduling import Way
from kernelbake.admission.variants import Pick, pick
from kernelbake.admission.volumes import image_volumes
from kernelbake.admission.workloads import (
    CONTAINER_FIELDS,
    MalformedObject,
    pod_spec,
    pointer,
    template_metadata,
)
from kernelbake.contract.artifact import MANIFEST_DIGEST_ENV, ArtifactKind, CacheArtifactFacts
from kernelbake.contract.delta import DELTA_DIGEST_ENV
from kernelbake.contract.key import CacheKey
from kernelbake.contract.layout import CACHE_ROOT
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


class MountMode(enum.Enum):
    IMAGE_VOLUME = "image-volume"
    INIT_CONTAINER = "init-container"


@dataclasses.dataclass(frozen=True)
class CacheVolume:
    """An image volume of the pod that names a governed repository."""

    index: int
    name: str
    ref: ImageRef
    # Containers that mount it: (field, index, name, image), init containers too (the copy).
    mounted_by: tuple[tuple[str, int, str, str], ...]

    @property
    def target(self) -> str:
        return self.ref.target


@dataclasses.dataclass(frozen=True)
class CachePlan:
    spec_path: tuple[str, ...]
    spec: Mapping[str, Any]
    # The opt-in: the variant index to take the artifact from, and how to mount it.
    index: ImageRef | None = None
    mode: MountMode = MountMode.IMAGE_VOLUME
    container: int = 0
    volumes: tuple[CacheVolume, ...] = ()
    problems: tuple[str, ...] = ()

    def opt_in_refs(self) -> dict[str, ImageRef]:
        """The opt-in's variant index alone (the webhook verifies image volumes as images)."""
        return {} if self.index is None else {_target(self.index): self.index}

    def refs(self) -> dict[str, ImageRef]:
        """What the gateway verifies first: the index and every governed image volume."""
        refs = {v.target: v.ref for v in self.volumes}
        if self.index is not None:
            refs[_target(self.index)] = self.index
        return refs


@dataclasses.dataclass(frozen=True)
class CacheDecision:
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    patch: tuple[Mapping[str, Any], ...] = ()


def _target(ref: ImageRef) -> str:
    return ref.target


def plan_caches(
    spec_path: tuple[str, ...], spec: Mapping[str, Any], metadata: Any, policy: AdmissionPolicy
) -> CachePlan | None:
    """None when the pod neither opts in nor mounts a governed image volume (nothing to do).
    ``metadata``: the object's metadata, where the annotations are (the pod template's for a
    workload: pass ``spec.template.metadata``). Raises ``MalformedObject`` for a bad shape."""
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    annotations = annotations if isinstance(annotations, dict) else {}
    problems: list[str] = []
    index: ImageRef | None = None
    mode = MountMode.IMAGE_VOLUME
    raw_index = annotations.get(ANNOTATION_INDEX)
    if raw_index is not None:
        index, problem = _governed_ref(raw_index, f"annotation {ANNOTATION_INDEX}", policy, required=True)
        problems += [problem] if problem else []
        raw_mode = annotations.get(ANNOTATION_MOUNT, MountMode.IMAGE_VOLUME.value)
        try:
            mode = MountMode(raw_mode)
        except ValueError:
            choices = ", ".join(m.value for m in MountMode)
            problems.append(f"annotation {ANNOTATION_MOUNT}: {raw_mode!r} is not one of {choices}")
    containers = _list(spec, "containers", spec_path)
    names = [c.get("name") if isinstance(c, dict) else None for c in containers]
    container = 0
    wanted = annotations.get(ANNOTATION_CONTAINER)
    if wanted is not None:
        if wanted not in names:
            problems.append(f"annotation {ANNOTATION_CONTAINER}: the pod has no container {wanted!r}")
        else:
            container = names.index(wanted)
    volumes: list[CacheVolume] = []
    users = _users(spec, spec_path)
    # The same reading of the volumes as the image-volume review (a bad shape raises there
    # and here alike; a reference not set yet is skipped by both).
    for volume in image_volumes(spec_path, spec):
        ref, problem = _governed_ref(volume.image, volume.where, policy)
        if problem:
            problems.append(problem)
        if ref is None:
            continue
        volumes.append(CacheVolume(volume.index, volume.name, ref, tuple(users.get(volume.name, ()))))
    # Each is checked against every container that uses the caches (volumes times containers).
    cap("the pod's image volumes naming governed repositories", volumes, MAX_CACHE_VOLUMES)
    if raw_index is None and not volumes and not problems and not sets_delta_pin(spec):
        return None
    if raw_index is not None and not containers:
        problems.append(f"annotation {ANNOTATION_INDEX}: the pod has no container to give the caches to")
    return CachePlan(spec_path, spec, index, mode, container, tuple(volumes), tuple(problems))


def sets_delta_pin(spec: Mapping[str, Any]) -> bool:
    """Whether a container sets ``$KERNELBAKE_DELTA_DIGEST``: a pod that does is reviewed for its
    deltas (``admission.deltas``) even with no other cache to judge."""
    for field in CONTAINER_FIELDS:
        items = spec.get(field)
        for c in items if isinstance(items, list) else ():
            env = c.get("env") if isinstance(c, dict) else None
            if any(isinstance(e, dict) and e.get("name") == DELTA_DIGEST_ENV for e in env or ()):
                return True
    return False


def is_delta(outcome: Outcome | None) -> bool:
    """An outcome that verified a cache delta (``signing.delta.VerifiedDelta``), judged by
    ``admission.deltas`` rather than as a cache artifact."""
    return isinstance(outcome, Accepted) and getattr(outcome.image, "base_manifest", None) is not None


def _users(spec: Mapping[str, Any], spec_path: tuple[str, ...]) -> dict[str, list[tuple[str, int, str, str]]]:
    """Volume name → the (init) containers that mount it, in one pass over the mounts."""
    users: dict[str, list[tuple[str, int, str, str]]] = {}
    for field in ("initContainers", "containers"):
        for j, c in enumerate(_list(spec, field, spec_path)):
            if not isinstance(c, dict):
                continue
            user = (field, j, str(c.get("name", "")), str(c.get("image", "")))
            mounts = c.get("volumeMounts")
            # A pod author's junk (a list as a name, a number as the list) is no mount of a volume.
            mounted: set[str] = {
                m["name"]
                for m in (mounts if isinstance(mounts, list) else ())
                if isinstance(m, dict) and isinstance(m.get("name"), str)
            }
            for name in mounted:
                users.setdefault(name, []).append(user)
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


def _list(spec: Mapping[str, Any], field: str, spec_path: tuple[str, ...]) -> list[Any]:
    items = spec.get(field)
    if items is None:
        return []
    if not isinstance(items, list):
        raise MalformedObject(f"{'.'.join(spec_path)}.{field} must be a list")
    return items


def _governed_ref(
    text: Any, where: str, policy: AdmissionPolicy, *, required: bool = False
) -> tuple[ImageRef | None, str | None]:
    """(the reference when the policy governs it, a problem when it cannot be read, or when it
    is ``required`` to be governed and is not)."""
    if not isinstance(text, str):
        return None, f"{where}: the reference must be a string"
    try:
        ref = parse_reference(text)
    except InvalidReference as exc:
        return None, f"{where}: {exc}"
    if not policy.governs(ref.name):
        # An opt-in naming an index this policy does not govern could not be verified.
        return None, f"{where}: {ref.name} is not a repository this policy governs" if required else None
    if ref.tag is None and ref.digest is None:
        return None, f"{where}: {text} has no tag or digest"
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
    chosen = _chosen(plan, outcomes, ways, policy, judge)
    if chosen is None or isinstance(chosen, str) or plan.index is None:
        return {}
    artifact, image = chosen
    refs = {f"{plan.index.name}@{artifact.digest}": plan.index}
    if image is not None:
        refs[f"{plan.index.name}@{image.digest}"] = plan.index
    return {t: parse_reference(t) for t in refs}


def _chosen(
    plan: CachePlan,
    outcomes: Mapping[str, Outcome],
    ways: Sequence[Way],
    policy: AdmissionPolicy,
    judge: gpus.Judge,
) -> tuple[Variant, Variant | None] | str | None:
    """(cache artifact, the same key's image for an init container) the index picks, a
    problem, or None while the index has no verdict."""
    if plan.index is None:
        return None
    outcome = outcomes.get(_target(plan.index))
    if outcome is None:
        return None
    if isinstance(outcome, Rejected):
        return f"annotation {ANNOTATION_INDEX}: {plan.index} was rejected: {outcome.reason}"
    if isinstance(outcome, Unavailable):
        return f"annotation {ANNOTATION_INDEX}: {plan.index} could not be verified: {outcome.reason}"
    if not isinstance(outcome, IndexAccepted):
        return f"annotation {ANNOTATION_INDEX}: {plan.index} is one image, not a model's variant index"
    variants = outcome.index.variants
    cpu = [v for v in of_kind(variants, ArtifactKind.CACHE) if not is_gpu(v.key)]
    if cpu and ways and not any(admitted(w, judge.catalogue).pins_gpu for w in ways):
        # A pod that asks for no GPU runs the CPU build: its caches, when the model has them.
        chosen = Pick(cpu[0])
    else:
        chosen = pick(variants, ways, judge.catalogue, policy.gpu_match, ArtifactKind.CACHE)
    if chosen.variant is None:
        hint = f"; {chosen.hint}" if chosen.hint else ""
        return f"annotation {ANNOTATION_INDEX}: {'; '.join(chosen.problems)}{hint}"
    image = None
    if plan.mode is MountMode.INIT_CONTAINER:
        image = next(
            (v for v in variants if v.kind is ArtifactKind.IMAGE and v.key == chosen.variant.key), None
        )
        if image is None:
            return (
                f"annotation {ANNOTATION_MOUNT}: {MountMode.INIT_CONTAINER.value} copies the caches with the "
                f"model's full image, and {plan.index} lists none with key {chosen.variant.key.digest}; "
                f"publish it (kernelbake build --publish both) or use {MountMode.IMAGE_VOLUME.value}"
            )
    return chosen.variant, image


def _verified_artifact(subject: str, target: str, outcome: Outcome | None) -> VerifiedArtifact | str:
    if outcome is None:
        return f"{subject}: verification did not finish in time"
    if isinstance(outcome, Rejected):
        return f"{subject} was rejected: {outcome.reason}"
    if isinstance(outcome, Unavailable):
        return f"{subject} could not be verified: {outcome.reason}"
    if isinstance(outcome, IndexAccepted):
        return f"{subject} names a variant index; an image volume needs one cache artifact by digest"
    assert isinstance(outcome, Accepted)
    facts = getattr(outcome.image, "artifact", None)
    if not isinstance(facts, CacheArtifactFacts):
        return f"{subject} is a kernelbake image, not a cache artifact: an image volume takes the REPO:TAG-cache artifact"
    name = target.rsplit("@", 1)[0] if "@" in target else target.rsplit(":", 1)[0]
    return VerifiedArtifact(f"{name}@{outcome.image.digest}", outcome.image.key, facts)


def decide_caches(
    plan: CachePlan,
    outcomes: Mapping[str, Outcome],
    ways: Sequence[Way],
    policy: AdmissionPolicy,
    judge: gpus.Judge,
    *,
    mutate: bool,
    verified_elsewhere: bool = False,
    budget: Budget = UNBOUNDED,
) -> CacheDecision:
    """Problems, notes and (``mutate``) the JSONPatch for the pod's caches. ``review`` denies
    (or, in warn mode, warns) on problems exactly as for images. ``verified_elsewhere``: an
    image volume that did not verify, or verified as a kernelbake image or GPU index rather than
    a cache artifact, is judged by the image review (which verifies every governed image volume:
    denied, or admitted with its note) and not said twice here."""
    problems = list(plan.problems)
    notes: list[str] = []
    patch: list[dict[str, Any]] = []
    containers = plan.spec.get("containers") or []
    at_root = _at_cache_root(plan.spec)
    for volume in plan.volumes:
        # Volumes times containers: past MAX_PROBLEMS the review is denied already, and every
        # further check would only add a string to a message that shows a few.
        if len(problems) >= MAX_PROBLEMS:
            break
        subject = f'image volume "{volume.name}" ({volume.ref})'
        outcome = outcomes.get(volume.target)
        if is_delta(outcome):
            continue  # admission.deltas judges it, against the container that mounts it
        got = _verified_artifact(subject, volume.target, outcome)
        if isinstance(got, str):
            # With the webhook's image review beside this, what did not verify is its problem
            # already, and a kernelbake image or GPU index as a volume is judged there too.
            is_artifact = (
                isinstance(outcome, Accepted) and getattr(outcome.image, "artifact", None) is not None
            )
            if not verified_elsewhere or is_artifact:
                problems.append(got)
            continue
        problems += _judged(subject, got.key, ways, judge, notes)
        problems += _engine_problems(containers, at_root, volume, got, budget, MAX_PROBLEMS - len(problems))
        digest = got.pinned.rsplit("@", 1)[1]
        if mutate and volume.ref.digest != digest:
            patch.append(
                {
                    "op": "replace",
                    "path": pointer((*plan.spec_path, "volumes", str(volume.index), "image", "reference")),
                    "value": volume.ref.rewritten(digest),
                }
            )
    if len(problems) >= MAX_PROBLEMS:
        problems.append(stopped())
    problems += _annotation_problems(plan, outcomes, ways, policy, judge, mutate, notes, patch)
    return CacheDecision(tuple(problems), tuple(notes), tuple(patch))


def _engine_problems(
    containers: Sequence[Mapping[str, Any]],
    at_root: Iterable[int],
    volume: CacheVolume,
    got: VerifiedArtifact,
    budget: Budget,
    room: int,
) -> list[str]:
    """What is wrong with the engine images, arguments and environment of the containers that
    mount ``volume`` (or, ``at_root``, mount the cache root) against the artifact it holds;
    checking stops once ``room`` problems are found (the caller says it stopped)."""
    problems: list[str] = []
    for field, _index, name, image in volume.mounted_by:
        budget.check()
        if len(problems) >= room:
            return problems
        problems += engine_problems(f'{_kind(field)} "{name}"', image, got)
    mounting = [j for f, j, _, _ in volume.mounted_by if f == "containers"]
    for index in sorted({*mounting, *at_root}):
        budget.check()
        if len(problems) >= room:
            return problems
        c = containers[index]
        where = f'container "{c.get("name", index)}"'
        if not any(u[:2] == ("containers", index) for u in volume.mounted_by):
            problems += engine_problems(where, str(c.get("image", "")), got)
        problems += args_problems(where, c, got)
        problems += env_problems(where, c, got)
    return problems


def _annotation_problems(
    plan: CachePlan,
    outcomes: Mapping[str, Outcome],
    ways: Sequence[Way],
    policy: AdmissionPolicy,
    judge: gpus.Judge,
    mutate: bool,
    notes: list[str],
    patch: list[dict[str, Any]],
) -> list[str]:
    """The opt-in annotation's index: its variant chosen and (``mutate``) mounted, unless the
    pod has its volume already."""
    if plan.index is None:
        return []
    if any(isinstance(v, dict) and v.get("name") == VOLUME_NAME for v in plan.spec.get("volumes") or []):
        # Patched already (an UPDATE, or the validating webhook after the mutating one): the
        # image volume was checked above as any other; patching again would duplicate it.
        notes.append(f"annotation {ANNOTATION_INDEX}: the pod has its {VOLUME_NAME} volume already")
        return []
    if plan.problems:
        return []
    chosen = _chosen(plan, outcomes, ways, policy, judge)
    if isinstance(chosen, str):
        return [chosen]
    if chosen is None:
        return [f"annotation {ANNOTATION_INDEX}: {plan.index}: verification did not finish in time"]
    if mutate:
        return _opt_in(plan, outcomes, ways, judge, chosen, notes, patch)
    return []


def _opt_in(
    plan: CachePlan,
    outcomes: Mapping[str, Outcome],
    ways: Sequence[Way],
    judge: gpus.Judge,
    chosen: tuple[Variant, Variant | None],
    notes: list[str],
    patch: list[dict[str, Any]],
) -> list[str]:
    assert plan.index is not None
    variant, image = chosen
    target = f"{plan.index.name}@{variant.digest}"
    subject = f"the {variant.key.device} cache artifact of {plan.index}"
    got = _verified_artifact(subject, target, outcomes.get(target))
    if isinstance(got, str):
        return [got]
    if got.key != variant.key:
        return [
            f"{subject}: the index claims key {variant.key.digest}, the artifact verifies as {got.key.digest}"
        ]
    problems = _judged(subject, got.key, ways, judge, notes)
    containers = plan.spec["containers"]
    container = containers[plan.container]
    where = f'container "{container.get("name", plan.container)}"'
    problems += engine_problems(where, str(container.get("image", "")), got)
    problems += env_problems(where, container, got)
    given = bool(container.get("command") or container.get("args"))
    if given:
        problems += args_problems(where, container, got)
    if problems:
        return problems
    seed_image = None
    if image is not None:
        seed_target = f"{plan.index.name}@{image.digest}"
        seeded = outcomes.get(seed_target)
        if not isinstance(seeded, Accepted) or seeded.image.key != got.key:
            reason = (
                seeded.reason
                if isinstance(seeded, (Rejected, Unavailable))
                else "not verified as that key's image"
            )
            return [f"the init container's image {seed_target}: {reason}"]
        seed_image = f"{plan.index.written_name}@{image.digest}"
    base = plan.spec_path
    c_ptr = (*base, "containers", str(plan.container))
    seed_mounts = [{"name": VOLUME_NAME, "mountPath": SEED_PATH}]
    if seed_image is None:
        # The artifact, read-only, copied by the engine image itself (cp -a keeps mtimes) into
        # the writable cache root: Inductor takes lock files under its cache directory on every
        # start, so a read-only mount at the cache root fails ("Read-only file system").
        artifact = {"reference": f"{plan.index.written_name}@{variant.digest}", "pullPolicy": "IfNotPresent"}
        append(patch, plan.spec, base, "volumes", {"name": ARTIFACT_VOLUME, "image": artifact})
        seed: dict[str, Any] = {
            "name": COPY_CONTAINER,
            "image": str(container.get("image", "")),
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
    append(patch, plan.spec, base, "volumes", {"name": VOLUME_NAME, "emptyDir": {}})
    append(patch, plan.spec, base, "initContainers", seed)
    append(patch, container, c_ptr, "volumeMounts", {"name": VOLUME_NAME, "mountPath": CACHE_ROOT})
    present = {e.get("name") for e in container.get("env") or [] if isinstance(e, dict)}
    for name, value in [*got.facts.env, (MANIFEST_DIGEST_ENV, got.facts.manifest_digest)]:
        if name not in present:
            append(patch, container, c_ptr, "env", {"name": name, "value": value})
            present.add(name)
    if not given:
        patch.append({"op": "add", "path": pointer((*c_ptr, "command")), "value": list(got.facts.command)})
        notes.append(f"{where}: command set to the one the cache artifact was compiled for")
    return []


def append(
    patch: list[dict[str, Any]], obj: Mapping[str, Any], at: tuple[str, ...], field: str, value: Any
) -> None:
    """Add ``value`` to the list ``obj[field]``, creating the list when neither the pod nor an
    earlier op of this patch has it."""
    whole = pointer((*at, field))
    if isinstance(obj.get(field), list) or any(op["path"] == whole for op in patch):
        patch.append({"op": "add", "path": pointer((*at, field, "-")), "value": value})
    else:
        patch.append({"op": "add", "path": whole, "value": [value]})


def _kind(field: str) -> str:
    return "init container" if field == "initContainers" else "container"


def _at_cache_root(spec: Mapping[str, Any]) -> list[int]:
    """spec.containers that mount anything at or under the cache root (the emptyDir an init
    container copied an artifact to, or part of it): with those that mount an artifact itself,
    the containers that run the engine on its caches. Paths as the container resolves them
    (``trusted_paths.normal``): ``/opt/kernelbake/cache/`` and ``/opt//kernelbake/./cache`` are
    the cache root too, and a container mounting it so is checked like one that writes it plainly.
    One pass, shared by every volume."""
    out = []
    for j, c in enumerate(spec.get("containers") or []):
        mounts = c.get("volumeMounts") or [] if isinstance(c, dict) else []
        if any(isinstance(m, dict) and _under_cache_root(m.get("mountPath")) for m in mounts):
            out.append(j)
    return out


def _under_cache_root(path: Any) -> bool:
    if not isinstance(path, str):
        return False
    resolved = normal(path)
    return resolved == CACHE_ROOT or resolved.startswith(CACHE_ROOT + "/")


def _judged(
    subject: str, key: CacheKey, ways: Sequence[Way], judge: gpus.Judge, notes: list[str]
) -> list[str]:
    verdict = judge(key, ways)
    notes += [f"{subject}: {n}" for n in verdict.notes]
    if verdict.ok:
        return []
    return [
        f"{subject} was baked for {key.device} ({key.arch}) but {'; '.join(verdict.problems)}; {verdict.hint}"
    ]
