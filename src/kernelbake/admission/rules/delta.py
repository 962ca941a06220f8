"""Cache deltas at admission (``contract.delta``): a pod may mount one only on the image it was
captured from.

A delta arrives as an image volume of a governed repository; the gateway verifies it
(``signing.delta.read_delta``: a signature the policy trusts, its shape, delta.json naming its
subject as the base) and the image review pins the volume by digest with the other images. Here,
pure, for each container that mounts it:

- at ``DELTA_ROOT``, the one place ``serve`` reads a delta from;
- running a verified kernelbake image (named directly, not through a GPU index) whose digest is
  the delta's base, with the same key and the same pinned cache manifest;
- ``$KERNELBAKE_DELTA_DIGEST`` set to the verified delta.json's digest: patched in when absent,
  refused when it differs.

A container that sets ``$KERNELBAKE_DELTA_DIGEST`` without mounting a verified delta is refused:
the variable is what makes ``serve`` trust the files at ``DELTA_ROOT``, so only a verification
may set it. Every entry of it counts, in every container kind (Kubernetes gives a container the
last of a name listed twice, so judging the first let a second pin a delta nobody signed), and
so does every mount at or inside ``DELTA_ROOT``: only the verified delta's volume, whole.
``serve`` then still checks every file's sha256, the key, the base bundle and that no baked
file changes (``runtime.delta``); nothing here reads the files.

A delta of a replica's own bytes (origin ``replica``) verifies only under a policy with
``unsafe_replica_deltas`` (``signing.delta``); the answer then says so for each container.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from kernelbake.admission.gateway import Accepted, Outcome
from kernelbake.admission.references import InvalidReference, parse_reference
from kernelbake.admission.rules.caches import CacheDecision, CachePlan, append, is_delta
from kernelbake.admission.rules.trusted_paths import normal
from kernelbake.admission.workloads import CONTAINER_FIELDS
from kernelbake.contract.delta import DELTA_DIGEST_ENV, DELTA_ROOT, Origin
from kernelbake.contract.key import CacheKey


class DeltaLike(Protocol):
    """What admission needs of ``signing.delta.VerifiedDelta``."""

    @property
    def digest(self) -> str: ...

    @property
    def key(self) -> CacheKey: ...

    @property
    def base_digest(self) -> str: ...

    @property
    def base_manifest(self) -> str: ...

    @property
    def manifest_digest(self) -> str: ...

    @property
    def origin(self) -> str: ...


def delta_of(outcome: Outcome | None) -> DeltaLike | None:
    """The verified delta an outcome holds, or None (an image, an artifact, a failure)."""
    if isinstance(outcome, Accepted) and is_delta(outcome):
        image: Any = outcome.image
        return image  # type: ignore[no-any-return]
    return None


def _base_problems(where: str, image: str, delta: DeltaLike, outcomes: Mapping[str, Outcome]) -> list[str]:
    try:
        ref = parse_reference(image)
    except InvalidReference as exc:
        return [f"{where}: {exc}"]
    outcome = outcomes.get(ref.target)
    got = outcome.image if isinstance(outcome, Accepted) else None
    if got is None or delta_of(outcome) is not None or getattr(got, "artifact", None) is not None:
        return [
            f"{where}: a cache delta is layered on a kernelbake image, and {image} did not verify as one "
            "(name the image the delta was captured from, by digest)"
        ]
    problems = []
    if got.digest != delta.base_digest:
        problems.append(
            f"{where}: the delta is layered on {delta.base_digest}, but the container runs {got.digest}; "
            "capture a delta from a replica of this image"
        )
    if got.key != delta.key:
        problems.append(f"{where}: the delta is for key {delta.key.digest}, the image's is {got.key.digest}")
    manifest = getattr(got, "manifest_digest", None)
    if manifest is not None and manifest != delta.base_manifest:
        problems.append(
            f"{where}: the delta is layered on the bundle {delta.base_manifest}, the image holds {manifest}"
        )
    return problems


_KINDS = {"initContainers": "init container", "ephemeralContainers": "ephemeral container"}


def _at_root(mount: Mapping[str, Any]) -> bool:
    path = mount.get("mountPath")
    return isinstance(path, str) and (normal(path) == DELTA_ROOT or normal(path).startswith(DELTA_ROOT + "/"))


def _pin_problems(subject: str, env: Sequence[Mapping[str, Any]], delta: DeltaLike) -> list[str]:
    """Every entry of ``$KERNELBAKE_DELTA_DIGEST`` against the verified delta.json."""
    if len(env) > 1:
        return [
            f"{subject}: ${DELTA_DIGEST_ENV} is listed {len(env)} times; Kubernetes gives the container the "
            "last, so list it once (or leave it to admission)"
        ]
    if env and (env[0].get("value") != delta.manifest_digest or "valueFrom" in env[0]):
        shown = "a valueFrom" if "valueFrom" in env[0] else repr(env[0].get("value"))
        return [
            f"{subject}: ${DELTA_DIGEST_ENV} is {shown}, the verified delta.json is {delta.manifest_digest}"
        ]
    return []


def _mount_problems(
    where: str, c: Mapping[str, Any], deltas: Mapping[str, Any]
) -> tuple[list[Any], list[str]]:
    """The container's mounts of verified deltas, and what is wrong with its mounts at or
    inside ``DELTA_ROOT`` (anything but one verified delta, whole, at the root)."""
    # A name that is no string (a pod author's junk) names no volume, verified or not.
    mounts = [
        {**m, "name": m["name"] if isinstance(m.get("name"), str) else None}
        for m in c.get("volumeMounts") or []
        if isinstance(m, dict)
    ]
    problems = [
        f"{where}: volume {str(m.get('name'))[:80]!r} is mounted at {str(m.get('mountPath'))[:80]!r}, where serve "
        "reads the cache delta it merges; only a verified cache delta's image volume belongs there, whole"
        for m in mounts
        if m.get("name") not in deltas and _at_root(m)
    ]
    problems += [
        f"{where}: cache delta {str(m.get('name'))[:80]!r} is mounted in part (subPath); mount it at {DELTA_ROOT} whole"
        for m in mounts
        if m.get("name") in deltas and (m.get("subPath") or m.get("subPathExpr"))
    ]
    return [m for m in mounts if m.get("name") in deltas], problems


def _unsafe_origin(subject: str, delta: DeltaLike) -> list[str]:
    """The answer's word on a delta of a replica's own bytes (verified only under the unsafe setting)."""
    if delta.origin == Origin.REBUILT.value:
        return []
    return [
        f"{subject}: UNSAFE: the bytes a replica wrote, signed without a rebuild; admitted only because the "
        "policy sets verify.unsafe_replica_deltas"
    ]


def decide_deltas(plan: CachePlan, outcomes: Mapping[str, Outcome], *, mutate: bool) -> CacheDecision:
    """Problems, notes and (``mutate``) the patch that pins each mounted delta for ``serve``."""
    deltas = {v.name: (v, d) for v in plan.volumes if (d := delta_of(outcomes.get(v.target))) is not None}
    problems: list[str] = []
    notes: list[str] = []
    patch: list[dict[str, Any]] = []
    for field in CONTAINER_FIELDS:
        for j, c in enumerate(plan.spec.get(field) or []):
            if not isinstance(c, dict):
                continue
            where = f'{_KINDS.get(field, "container")} "{c.get("name", j)}"'
            mounts, wrong = _mount_problems(where, c, deltas)
            problems += wrong
            env = [e for e in c.get("env") or [] if isinstance(e, dict) and e.get("name") == DELTA_DIGEST_ENV]
            if not mounts:
                if env:
                    problems.append(
                        f"{where}: sets ${DELTA_DIGEST_ENV} but mounts no verified cache delta; only admission "
                        "sets it, for a delta it verified"
                    )
                continue
            if len(mounts) > 1:
                problems.append(
                    f"{where}: mounts {len(mounts)} cache deltas; serve reads one, at {DELTA_ROOT}"
                )
                continue
            volume, delta = deltas[mounts[0]["name"]]
            subject = f'{where}: cache delta "{volume.name}" ({volume.ref})'
            path = mounts[0].get("mountPath")
            if not isinstance(path, str) or posixpath.normpath(path) != DELTA_ROOT:
                problems.append(f"{subject}: mounted at {path!r}; serve reads a delta only at {DELTA_ROOT}")
                continue
            found = _base_problems(subject, str(c.get("image", "")), delta, outcomes)
            found += _pin_problems(subject, env, delta)
            problems += found
            if found or wrong:
                continue
            notes += _unsafe_origin(subject, delta)
            if not env and mutate:
                append(
                    patch,
                    c,
                    (*plan.spec_path, field, str(j)),
                    "env",
                    {"name": DELTA_DIGEST_ENV, "value": delta.manifest_digest},
                )
                notes.append(f"{subject}: verified and pinned ({DELTA_DIGEST_ENV}={delta.manifest_digest})")
            elif not env:
                notes.append(f"{subject}: ${DELTA_DIGEST_ENV} is unset, so serve will not use the delta")
    return CacheDecision(tuple(problems), tuple(notes), tuple(patch))
