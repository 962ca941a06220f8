"""Cache deltas at admission (``contract.delta``): a pod may mount one only on the image it was
captured from.

A delta arrives as an image volume of a governed repository; the gateway verifies it
(``signing.delta.read_delta``: a signature the policy trusts, its shape, delta.json naming its
subject as the base) and the signature rule pins the volume by digest with the other images.
Here, for each container that mounts it:

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
from typing import Any

from kernelbake.admission.pod import Container, Mount
from kernelbake.admission.references import InvalidReference, parse_reference
from kernelbake.admission.rules.caches import CacheVolume
from kernelbake.admission.rules.facts import Facts, Rule
from kernelbake.admission.rules.roots import root_mounts
from kernelbake.admission.rules.shape import EMPTY, Denial, Verdict, append, verdict
from kernelbake.admission.subject import DeltaLike, ImageLike
from kernelbake.contract.delta import DELTA_DIGEST_ENV, DELTA_ROOT, Layering, Origin, base_problems

Deltas = Mapping[str, tuple[CacheVolume, DeltaLike]]


def check(facts: Facts) -> Verdict:
    """Problems, notes and (mutating) the patch that pins each mounted delta for ``serve``."""
    if facts.caches is None:
        return EMPTY
    deltas = {
        v.name: (v, d) for v in facts.caches.volumes if (d := facts.subjects.deltas.get(v.target)) is not None
    }
    denials: list[Denial] = []
    notes: list[str] = []
    patch: list[dict[str, Any]] = []
    for c in facts.pod.containers:
        mounts, wrong = root_mounts(
            c, deltas, DELTA_ROOT, what="cache delta", use="reads the cache delta it merges"
        )
        denials += wrong
        env = c.named(DELTA_DIGEST_ENV)
        if len(mounts) != 1:
            denials += _not_one(c, mounts, env)
            continue
        volume, delta = deltas[str(mounts[0].name)]
        subject = f'cache delta "{volume.name}" ({volume.ref})'
        found = _layered(c, subject, mounts[0], delta, facts.subjects.images)
        found += [Denial(c.where, f"{subject}: {p}") for p in _pin_problems(env, delta)]
        denials += found
        if found or wrong:
            continue
        notes += _unsafe_origin(c, subject, delta)
        if not env and facts.mutate:
            append(patch, c.obj, c.at, "env", {"name": DELTA_DIGEST_ENV, "value": delta.manifest_digest})
            notes.append(
                f"{c.where}: {subject}: verified and pinned ({DELTA_DIGEST_ENV}={delta.manifest_digest})"
            )
        elif not env:
            notes.append(
                f"{c.where}: {subject}: ${DELTA_DIGEST_ENV} is unset, so serve will not use the delta"
            )
    return verdict(denials, notes, patch)


def _not_one(c: Container, mounts: Sequence[Mount], env: Sequence[Mapping[str, Any]]) -> list[Denial]:
    """A container that mounts no verified delta may not pin one; one that mounts several is refused."""
    if mounts:
        return [Denial(c.where, f"mounts {len(mounts)} cache deltas; serve reads one, at {DELTA_ROOT}")]
    if env:
        return [
            Denial(
                c.where,
                f"sets ${DELTA_DIGEST_ENV} but mounts no verified cache delta",
                "only admission sets it, for a delta it verified",
            )
        ]
    return []


def _layered(
    c: Container, subject: str, mount: Mount, delta: DeltaLike, images: Mapping[str, ImageLike]
) -> list[Denial]:
    """What is wrong with where the delta is mounted and what it is layered on."""
    if not isinstance(mount.path, str) or posixpath.normpath(mount.path) != DELTA_ROOT:
        return [
            Denial(c.where, f"{subject}: mounted at {mount.path!r}; serve reads a delta only at {DELTA_ROOT}")
        ]
    return [Denial(c.where, f"{subject}: {p}") for p in _base_problems(c.image, delta, images)]


def _base_problems(image: str, delta: DeltaLike, images: Mapping[str, ImageLike]) -> list[str]:
    try:
        ref = parse_reference(image)
    except InvalidReference as exc:
        return [str(exc)]
    got = images.get(ref.target)
    if got is None:
        return [
            f"a cache delta is layered on a kernelbake image, and {image} did not verify as one "
            "(name the image the delta was captured from, by digest)"
        ]
    on = Layering(key=delta.key, manifest=delta.base_manifest, image=delta.base_digest)
    runs = Layering(key=got.key, manifest=got.manifest_digest, image=got.digest)
    return base_problems(on, runs, named="the container's image")


def _pin_problems(env: Sequence[Mapping[str, Any]], delta: DeltaLike) -> list[str]:
    """Every entry of ``$KERNELBAKE_DELTA_DIGEST`` against the verified delta.json."""
    if len(env) > 1:
        return [
            f"${DELTA_DIGEST_ENV} is listed {len(env)} times; Kubernetes gives the container the last, so list "
            "it once (or leave it to admission)"
        ]
    if env and (env[0].get("value") != delta.manifest_digest or "valueFrom" in env[0]):
        shown = "a valueFrom" if "valueFrom" in env[0] else repr(env[0].get("value"))
        return [f"${DELTA_DIGEST_ENV} is {shown}, the verified delta.json is {delta.manifest_digest}"]
    return []


def _unsafe_origin(c: Container, subject: str, delta: DeltaLike) -> list[str]:
    """The answer's word on a delta of a replica's own bytes (verified only under the unsafe setting)."""
    if delta.origin == Origin.REBUILT.value:
        return []
    return [
        f"{c.where}: {subject}: UNSAFE: the bytes a replica wrote, signed without a rebuild; admitted only "
        "because the policy sets verify.unsafe_replica_deltas"
    ]


RULE = Rule(
    "delta",
    "a cache delta mounted elsewhere than the delta root, in part, or more than one to a container; "
    "layered on another image, key or pinned bundle than the container runs; or "
    "`$KERNELBAKE_DELTA_DIGEST` set by the pod to anything but the verified delta.json, listed twice, or "
    "without a verified delta mounted (nor may anything else be mounted at or inside the delta root)",
    check,
)
