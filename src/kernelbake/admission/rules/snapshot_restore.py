"""Snapshot restores at admission: the capabilities CRIU needs are granted only for a restore.

A container of a governed image that asks for any of the restore set
(``contract.snapshot.RESTORE_CAPABILITIES``, measured: SYS_ADMIN, NET_ADMIN, SYS_TIME) or for an
unconfined seccomp profile is admitted only when it

- mounts exactly one verified snapshot (an image volume the gateway verified with
  ``signing.snapshot.read_snapshot``: a trusted signature, its shape, its subject), whole, at
  ``SNAPSHOT_ROOT``, the one place ``serve`` restores from, with nothing else at or inside it;
- runs the image that snapshot was taken from (by digest, with the same cache key);
- would restore it: the key's serve arguments and environment as far as admission can know
  them (``_key_problems``): the image's entrypoint (no ``command``), the recorded arguments
  exactly, every variable it sets literally and as recorded; a ``valueFrom``, an ``envFrom`` or
  a ``$(VAR)`` in the arguments cannot be known here, so it is refused (fail closed);
- adds no capability beyond the restore set, is not privileged (which is every capability, so a
  privileged container asks for the set too), and is no ephemeral container; and its pod mounts
  no hostPath (with SYS_ADMIN a container could write through one into the node's image store,
  where the snapshot's files are) and has no privileged container of any image (one could enter
  the restoring container and change what it restores);
- has ``$KERNELBAKE_SNAPSHOT_DIGEST`` and ``$KERNELBAKE_IMAGE_DIGEST`` equal to the verified
  snapshot.json and image digests: patched in when absent, refused when they differ.

Otherwise the capabilities would reach an engine that starts baked, so the pod is denied with the
field that differs. A container that sets either variable without mounting a verified snapshot is
refused: they are what make ``serve`` trust the files at ``SNAPSHOT_ROOT``. ``serve`` then still
checks the whole key against the node (GPU, driver, kernel, CRIU, CPU, the whole environment,
which includes the image's ``ENV`` that admission does not see) and the files
(``runtime.snapshot.restore``). Containers of images the policy does not govern are not judged
here (Pod Security admission is where their capabilities are limited). Pure: the caller gives the
verified snapshots by volume name and the verified image of each container image.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Collection, Mapping
from typing import Any, Protocol

from kernelbake.admission.gateway import Accepted, Outcome
from kernelbake.admission.rules.caches import CacheDecision, append
from kernelbake.admission.rules.trusted_paths import normal
from kernelbake.admission.workloads import CONTAINER_FIELDS
from kernelbake.contract.key import CacheKey
from kernelbake.contract.snapshot import (
    IMAGE_DIGEST_ENV,
    RESTORE_CAPABILITIES,
    SNAPSHOT_DIGEST_ENV,
    SNAPSHOT_ROOT,
    SnapshotKey,
    is_volatile,
)
from kernelbake.signing.snapshot import VerifiedSnapshot

_PINNED = (SNAPSHOT_DIGEST_ENV, IMAGE_DIGEST_ENV)
_KINDS = {"initContainers": "init container", "ephemeralContainers": "ephemeral container"}
_SHOWN = 160


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedSnapshotVolume:
    """A verified snapshot artifact as the gateway keeps it beside images (``VerifiedLike``: its
    ``key`` is the cache key of the image it was taken from)."""

    reference: str
    digest: str
    key: CacheKey
    signer: str
    base_digest: str  # the image it was taken from
    manifest_digest: str  # snapshot.json's sha256: what $KERNELBAKE_SNAPSHOT_DIGEST pins
    snapshot_key: SnapshotKey
    environment: Mapping[str, str] | None


def snapshot_volume(verified: VerifiedSnapshot) -> VerifiedSnapshotVolume:
    return VerifiedSnapshotVolume(
        reference=verified.reference,
        digest=verified.digest,
        key=verified.key.cache_key,
        signer=verified.signer,
        base_digest=verified.base_digest,
        manifest_digest=verified.manifest_digest,
        snapshot_key=verified.key,
        environment=verified.environment,
    )


def snapshot_of(outcome: Outcome | None) -> VerifiedSnapshotVolume | None:
    """The verified snapshot an outcome holds, or None (an image, an artifact, a failure)."""
    if isinstance(outcome, Accepted) and isinstance(outcome.image, VerifiedSnapshotVolume):
        return outcome.image
    return None


class SnapshotLike(Protocol):
    """What the decision needs of ``VerifiedSnapshotVolume``."""

    @property
    def base_digest(self) -> str: ...

    @property
    def manifest_digest(self) -> str: ...

    @property
    def key(self) -> CacheKey: ...

    @property
    def snapshot_key(self) -> SnapshotKey: ...

    @property
    def environment(self) -> Mapping[str, str] | None: ...


class ImageLike(Protocol):
    """What the decision needs of a container's verified image."""

    @property
    def digest(self) -> str: ...

    @property
    def key(self) -> CacheKey: ...


def _dict(value: Any) -> Mapping[str, Any]:
    """``value`` where the pod spec has an object there; else nothing (a pod author's junk is
    judged as absent here, and its shape is the API server's to refuse)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _cap(name: object) -> str:
    return str(name).upper().removeprefix("CAP_")


def _asks(container: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[set[str], bool, bool]:
    """(capabilities added, seccomp unconfined, privileged) of ``container`` in ``pod``; the
    container's seccomp profile, else the pod's."""
    sc = _dict(container.get("securityContext"))
    added = {_cap(c) for c in _list(_dict(sc.get("capabilities")).get("add"))}
    profile = _dict(sc.get("seccompProfile")) or _dict(
        _dict(pod.get("securityContext")).get("seccompProfile")
    )
    return added, profile.get("type") == "Unconfined", sc.get("privileged") is True


def _inside_root(path: Any) -> bool:
    return isinstance(path, str) and (
        normal(path) == SNAPSHOT_ROOT or normal(path).startswith(SNAPSHOT_ROOT + "/")
    )


def _mounts(
    where: str, container: Mapping[str, Any], snapshots: Mapping[str, SnapshotLike]
) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The container's mounts of verified snapshots, and what is wrong with its mounts at or
    inside ``SNAPSHOT_ROOT``: anything but a verified snapshot there, whole, is a file serve would
    restore from (and, on its fast path, without hashing it)."""
    mounts: list[Mapping[str, Any]] = [m for m in _list(container.get("volumeMounts")) if isinstance(m, dict)]
    ours = [m for m in mounts if isinstance(m.get("name"), str) and m["name"] in snapshots]
    problems = [
        f"{where}: volume {str(m.get('name'))[:80]!r} is mounted at {str(m.get('mountPath'))[:80]!r}, where serve "
        "restores a snapshot from; only a verified snapshot's image volume belongs there, whole"
        for m in mounts
        if m not in ours and _inside_root(m.get("mountPath"))
    ]
    problems += [
        f"{where}: snapshot {str(m.get('name'))[:80]!r} is mounted in part (subPath); mount it at {SNAPSHOT_ROOT} whole"
        for m in ours
        if m.get("subPath") or m.get("subPathExpr")
    ]
    return ours, problems


def _restore_problems(
    where: str,
    container: Mapping[str, Any],
    mounts: list[Mapping[str, Any]],
    snapshots: Mapping[str, SnapshotLike],
    image: ImageLike | None,
) -> tuple[list[str], SnapshotLike | None]:
    if len(mounts) != 1:
        return [
            f"{where}: asks for the restore capabilities but mounts {len(mounts)} verified snapshots; "
            f"they are granted only to restore one, at {SNAPSHOT_ROOT}"
        ], None
    snapshot = snapshots[str(mounts[0]["name"])]
    path = mounts[0].get("mountPath")
    if not isinstance(path, str) or posixpath.normpath(path) != SNAPSHOT_ROOT:
        return [
            f"{where}: the snapshot is mounted at {path!r}; serve restores only from {SNAPSHOT_ROOT}"
        ], None
    if image is None or image.digest != snapshot.base_digest:
        runs = image.digest if image is not None else repr(container.get("image"))
        return [
            f"{where}: the snapshot was taken from {snapshot.base_digest}, but the container runs "
            f"{runs}; a restore is admitted only into its own image, by digest"
        ], None
    if image.key != snapshot.key:
        return [
            f"{where}: the snapshot's cache key is {snapshot.key.digest}, the image's is {image.key.digest}"
        ], None
    return [], snapshot


def _shown(text: str) -> str:
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}… ({len(text)} characters)"


def _args_problems(where: str, container: Mapping[str, Any], snapshot: SnapshotLike) -> list[str]:
    """``serve``'s arguments as the key records them: the image's entrypoint is
    ``kernelbake serve`` and a container's ``args`` are what follows it."""
    if container.get("command"):
        return [
            f"{where}: sets command; a restore runs the image's entrypoint (kernelbake serve) with the "
            "snapshot's arguments in args, so leave command unset"
        ]
    args = container.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return [f"{where}: args must be a list of strings"]
    if any("$(" in a for a in args):
        return [
            f"{where}: args refer to variables ($(NAME)), which the kubelet expands and admission cannot "
            "know; write the arguments the snapshot was taken with"
        ]
    recorded = snapshot.snapshot_key.serve_args
    if json.dumps(args) != recorded:
        return [
            f"{where}: serve args {_shown(json.dumps(args))} here, {_shown(recorded)} recorded; serve would "
            "start baked, with the restore's capabilities"
        ]
    return []


def _env_problems(where: str, container: Mapping[str, Any], snapshot: SnapshotLike) -> list[str]:
    """Each variable the container sets, against the environment the key digests. What the image's
    ENV adds is not seen here; serve compares the whole digest."""
    recorded = snapshot.environment
    if recorded is None:
        return [
            f"{where}: the snapshot's snapshot.json records no environment (taken by an older kernelbake), "
            "so admission cannot tell whether serve would restore it; take it again"
        ]
    problems = []
    if container.get("envFrom"):
        problems.append(
            f"{where}: envFrom brings variables admission cannot read, and the snapshot's key holds the "
            "environment; set each with a value"
        )
    for e in _list(container.get("env")):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or is_volatile(e["name"]):
            continue
        name = e["name"][:80]
        if "valueFrom" in e:
            problems.append(
                f"{where}: ${name} comes from valueFrom, which admission cannot read, and the snapshot's key "
                "holds the environment; set it with a value"
            )
        elif name not in recorded:
            problems.append(f"{where}: ${name} is set here, and was not when the snapshot was taken")
        elif recorded[name] != str(e.get("value", "")):
            problems.append(f"{where}: ${name} differs from the value the snapshot was taken with")
    return problems


def _pin(
    where: str,
    container: Mapping[str, Any],
    env: Mapping[str, Mapping[str, Any]],
    want: Mapping[str, str],
    patch: list[dict[str, Any]] | None,
    at: tuple[str, ...],
) -> list[str]:
    """Each pin as the verification says: refused where the pod set another, patched in
    (``patch`` given) where it set none."""
    problems = []
    for name, value in want.items():
        have = env.get(name)
        if have is not None and (have.get("value") != value or "valueFrom" in have):
            problems.append(f"{where}: ${name} is {have.get('value')!r}, the verified one is {value}")
        elif have is None and patch is not None:
            append(patch, container, at, "env", {"name": name, "value": value})
    return problems


def _host_paths(spec: Mapping[str, Any]) -> list[str]:
    return [
        str(v.get("name"))[:80]
        for v in _list(spec.get("volumes"))
        if isinstance(v, dict) and v.get("hostPath") is not None
    ]


@dataclasses.dataclass
class _Decision:
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    patch: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def _restore(
    out: _Decision,
    where: str,
    c: Mapping[str, Any],
    spec: Mapping[str, Any],
    mounts: list[Mapping[str, Any]],
    snapshots: Mapping[str, SnapshotLike],
    image: ImageLike | None,
    at: tuple[str, ...] | None,
) -> bool:
    """A container that asks for the restore set: admitted (True), pinned (``at``: where to
    patch), or refused naming why."""
    added, _, privileged = _asks(c, spec)
    wrong: list[str] = []
    if privileged:
        wrong.append(
            f"{where}: privileged grants every capability; a restore needs only "
            f"{', '.join(sorted(RESTORE_CAPABILITIES))} and seccomp Unconfined"
        )
    if extra := sorted(added - RESTORE_CAPABILITIES):
        wrong.append(
            f"{where}: adds {', '.join(extra)} beyond the restore set ({', '.join(sorted(RESTORE_CAPABILITIES))})"
        )
    if hosts := _host_paths(spec):
        wrong.append(
            f"{where}: asks for the restore capabilities in a pod with hostPath volumes ({', '.join(hosts[:4])}); "
            "with SYS_ADMIN a container could write through one into the node's image store, where the "
            "snapshot's files are"
        )
    found, snapshot = _restore_problems(where, c, mounts, snapshots, image)
    wrong += found
    if snapshot is not None:
        wrong += _args_problems(where, c, snapshot)
        wrong += _env_problems(where, c, snapshot)
    out.problems += wrong
    if snapshot is None or wrong:
        return False
    env = {str(e["name"]): e for e in _list(c.get("env")) if isinstance(e, dict) and e.get("name") in _PINNED}
    want = {SNAPSHOT_DIGEST_ENV: snapshot.manifest_digest, IMAGE_DIGEST_ENV: snapshot.base_digest}
    pinned = _pin(where, c, env, want, out.patch if at is not None else None, at or ())
    out.problems += pinned
    if not pinned:
        out.notes.append(
            f"{where}: restore of snapshot {snapshot.manifest_digest} admitted with {', '.join(sorted(added))}"
        )
    return not pinned


def decide_snapshots(
    spec: Mapping[str, Any],
    snapshots: Mapping[str, SnapshotLike],
    images: Mapping[str, ImageLike],
    *,
    governed: Collection[str] | None = None,
    spec_path: tuple[str, ...] = ("spec",),
    mutate: bool,
    after: Collection[Mapping[str, Any]] = (),
) -> CacheDecision:
    """Problems, notes and (``mutate``) the patch that pins each restore for ``serve``.
    ``snapshots``: volume name → verified snapshot; ``images``: container image → its verified
    image; ``governed``: the container images the policy governs (None: every container is
    judged). A container of another image is judged only when it mounts a verified snapshot or
    sets the pins. ``after``: the patch's operations so far, which a new list of variables must
    not replace."""
    out = _Decision(patch=[dict(op) for op in after])
    restores, privileged = 0, []
    for field in CONTAINER_FIELDS:
        for j, c in enumerate(_list(spec.get(field))):
            if not isinstance(c, dict):
                continue
            where = f'{_KINDS.get(field, "container")} "{str(c.get("name", j))[:80]}"'
            added, unconfined, whole = _asks(c, spec)
            privileged += [where] if whole else []
            mounts, wrong = _mounts(where, c, snapshots)
            pins = [e for e in _list(c.get("env")) if isinstance(e, dict) and e.get("name") in _PINNED]
            image = str(c.get("image", ""))
            if governed is not None and image not in governed and not mounts and not pins:
                continue
            out.problems += wrong
            # Privileged is every capability, the restore set among them.
            if not (added & RESTORE_CAPABILITIES or unconfined or whole):
                if pins:
                    names = sorted({str(e["name"]) for e in pins})
                    out.problems.append(
                        f"{where}: sets ${' and $'.join(names)} without the restore it pins; only "
                        "admission sets them, for a snapshot it verified"
                    )
                elif mounts:
                    out.notes.append(
                        f"{where}: mounts a snapshot without the restore capabilities; serve starts baked"
                    )
                continue
            if field == "ephemeralContainers":
                out.problems.append(
                    f"{where}: asks for the restore capabilities; serve restores only in a pod's containers"
                )
                continue
            at = (*spec_path, field, str(j)) if mutate else None
            restores += _restore(out, where, c, spec, mounts, snapshots, images.get(image), at)
    if restores and privileged:
        # Whatever its image: it could enter the restoring container (or the node) and change
        # what is restored, which serve trusts unhashed on a pulled image volume.
        out.problems.append(
            f"{', '.join(privileged[:4])}: privileged beside a snapshot restore; no container of a restoring "
            "pod may be privileged"
        )
    return CacheDecision(tuple(out.problems), tuple(out.notes), tuple(out.patch[len(after) :]))
