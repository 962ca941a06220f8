"""An image volume that verifies as a cache artifact (``contract.artifact``) must fit the pod:
its key on every GPU the pod can land on, and each container that mounts it (or anything at or
under the cache root, the path read as the container resolves it) running the engine image the
caches were compiled in (by manifest digest), with the serve arguments and cache variables the
key records when it gives any. What the volume's reference says (unreadable, no tag or digest)
is planned in ``caches`` and said here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kernelbake.admission.bounds import MAX_PROBLEMS, stopped
from kernelbake.admission.pod import Container
from kernelbake.admission.rules.cache_checks import (
    VerifiedArtifact,
    args_problems,
    engine_problems,
    env_problems,
    gpu_problems,
    verified_artifact,
)
from kernelbake.admission.rules.caches import CacheVolume
from kernelbake.admission.rules.facts import Facts, Rule
from kernelbake.admission.rules.shape import EMPTY, Denial, Verdict, verdict
from kernelbake.contract.layout import CACHE_ROOT


def check(facts: Facts) -> Verdict:
    if facts.caches is None:
        return EMPTY
    problems: list[Denial] = list(facts.caches.volume_problems)
    notes: list[str] = []
    containers = tuple(facts.pod.of("containers"))
    # The containers that run the engine on the caches, with those that mount an artifact itself.
    at_root = [c for c in containers if any(m.under(CACHE_ROOT) for m in c.mounts)]
    for volume in facts.caches.volumes:
        # Volumes times containers: past MAX_PROBLEMS the review is denied already, and every
        # further check would only add a string to a message that shows a few.
        if len(problems) >= MAX_PROBLEMS:
            break
        artifact = facts.subjects.artifacts.get(volume.target)
        if artifact is None:
            continue  # An image, delta or snapshot: another rule's (and a failure, signature's).
        got = verified_artifact(volume.target, artifact)
        found, said = gpu_problems(
            volume_where(volume), f"cache artifact {volume.ref}", got.key, facts.ways, facts.judge
        )
        problems += found
        notes += said
        problems += _engine_problems(containers, at_root, volume, got, facts, MAX_PROBLEMS - len(problems))
    if len(problems) >= MAX_PROBLEMS:
        problems.append(Denial("", stopped()))
    return verdict(problems, notes)


def volume_where(volume: CacheVolume) -> str:
    return f'image volume "{volume.name}"'


def _engine_problems(
    containers: Sequence[Container],
    at_root: Iterable[Container],
    volume: CacheVolume,
    got: VerifiedArtifact,
    facts: Facts,
    room: int,
) -> list[Denial]:
    """What is wrong with the engine images, arguments and environment of the containers that
    mount ``volume`` (or, ``at_root``, mount the cache root) against the artifact it holds;
    checking stops once ``room`` problems are found (the caller says it stopped)."""
    problems: list[Denial] = []
    for c in volume.mounted_by:
        facts.budget.check()
        if len(problems) >= room:
            return problems
        problems += engine_problems(c.where, c.image, got)
    mounting = {c.index for c in volume.mounted_by if c.field == "containers"}
    for index in sorted(mounting | {c.index for c in at_root}):
        facts.budget.check()
        if len(problems) >= room:
            return problems
        c = containers[index]
        if index not in mounting:
            problems += engine_problems(c.where, c.image, got)
        problems += args_problems(c.where, c.obj, got)
        problems += env_problems(c.where, c.obj, got)
    return problems


RULE = Rule(
    "cache-volume",
    "an image volume holding a cache artifact that does not fit the pod: its key against every GPU the "
    "pod can land on, a container mounting it (or the cache root) that runs another engine image than "
    "the one the caches were compiled in, gives other serve arguments than the key records, or sets its "
    "cache variables otherwise; or a governed volume reference that cannot be read",
    check,
)
