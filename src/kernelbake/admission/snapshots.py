"""Snapshot restores at admission: the capabilities CRIU needs are granted only for a restore.

A container that asks for any of the restore set (``contract.snapshot.RESTORE_CAPABILITIES``,
measured: SYS_ADMIN, NET_ADMIN, SYS_TIME) or for an unconfined seccomp profile is admitted only
when it

- mounts exactly one verified snapshot (an image volume the gateway verified with
  ``signing.snapshot.read_snapshot``: a trusted signature, its shape, its subject) at
  ``SNAPSHOT_ROOT``, the one place ``serve`` restores from;
- runs the image that snapshot was taken from (by digest);
- adds no capability beyond the restore set, and is not privileged (which is every capability);
- has ``$KERNELBAKE_SNAPSHOT_DIGEST`` and ``$KERNELBAKE_IMAGE_DIGEST`` equal to the verified
  snapshot.json and image digests: patched in when absent, refused when they differ.

A container that sets either variable without mounting a verified snapshot is refused: they are
what make ``serve`` trust the files at ``SNAPSHOT_ROOT``. ``serve`` then still checks the key
against the node and every file's sha256 (``runtime.snapshot.restore``); nothing here reads the
files. Pure: the caller gives the verified snapshots by volume name and the verified image digest
of each container.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any, Protocol

from kernelbake.admission.cache_volumes import CacheDecision, append
from kernelbake.contract.snapshot import (
    IMAGE_DIGEST_ENV,
    RESTORE_CAPABILITIES,
    SNAPSHOT_DIGEST_ENV,
    SNAPSHOT_ROOT,
)

_PINNED = (SNAPSHOT_DIGEST_ENV, IMAGE_DIGEST_ENV)


class SnapshotLike(Protocol):
    """What admission needs of ``signing.snapshot.VerifiedSnapshot``."""

    @property
    def base_digest(self) -> str: ...

    @property
    def manifest_digest(self) -> str: ...


def _cap(name: object) -> str:
    return str(name).upper().removeprefix("CAP_")


def _asks(container: Mapping[str, Any], pod: Mapping[str, Any]) -> tuple[set[str], bool, bool]:
    """(capabilities added, seccomp unconfined, privileged) of ``container`` in ``pod``."""
    sc = container.get("securityContext") or {}
    caps = (sc.get("capabilities") or {}).get("add") or [] if isinstance(sc, dict) else []
    added = {_cap(c) for c in caps} if isinstance(caps, list) else set()
    profile = (sc.get("seccompProfile") if isinstance(sc, dict) else None) or (
        pod.get("securityContext") or {}
    ).get("seccompProfile")
    unconfined = isinstance(profile, dict) and profile.get("type") == "Unconfined"
    return added, unconfined, isinstance(sc, dict) and sc.get("privileged") is True


def _mounts(container: Mapping[str, Any], snapshots: Mapping[str, SnapshotLike]) -> list[Mapping[str, Any]]:
    return [
        m for m in container.get("volumeMounts") or [] if isinstance(m, dict) and m.get("name") in snapshots
    ]


def _restore_problems(
    where: str,
    container: Mapping[str, Any],
    mounts: list[Mapping[str, Any]],
    snapshots: Mapping[str, SnapshotLike],
    digest: str | None,
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
    if digest is None or digest != snapshot.base_digest:
        return [
            f"{where}: the snapshot was taken from {snapshot.base_digest}, but the container runs "
            f"{digest or repr(container.get('image'))}; a restore is admitted only into its own image, by digest"
        ], None
    return [], snapshot


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


def decide_snapshots(
    spec: Mapping[str, Any],
    snapshots: Mapping[str, SnapshotLike],
    digests: Mapping[str, str],
    *,
    spec_path: tuple[str, ...] = ("spec",),
    mutate: bool,
) -> CacheDecision:
    """Problems, notes and (``mutate``) the patch that pins each restore for ``serve``.
    ``snapshots``: volume name → verified snapshot; ``digests``: container image → verified digest."""
    problems: list[str] = []
    notes: list[str] = []
    patch: list[dict[str, Any]] = []
    for field in ("initContainers", "containers"):
        for j, c in enumerate(spec.get(field) or []):
            if not isinstance(c, dict):
                continue
            where = f'{"init container" if field == "initContainers" else "container"} "{c.get("name", j)}"'
            added, unconfined, privileged = _asks(c, spec)
            asks = bool(added & RESTORE_CAPABILITIES) or unconfined
            env = {
                str(e.get("name")): e
                for e in c.get("env") or []
                if isinstance(e, dict) and e.get("name") in _PINNED
            }
            mounts = _mounts(c, snapshots)
            if not asks:
                if env:
                    problems.append(
                        f"{where}: sets ${' and $'.join(sorted(env))} without the restore it pins; only "
                        "admission sets them, for a snapshot it verified"
                    )
                elif mounts:
                    notes.append(
                        f"{where}: mounts a snapshot without the restore capabilities; serve starts baked"
                    )
                continue
            if privileged:
                problems.append(
                    f"{where}: privileged grants every capability; a restore needs only "
                    f"{', '.join(sorted(RESTORE_CAPABILITIES))} and seccomp Unconfined"
                )
            if extra := sorted(added - RESTORE_CAPABILITIES):
                problems.append(
                    f"{where}: adds {', '.join(extra)} beyond the restore set ({', '.join(sorted(RESTORE_CAPABILITIES))})"
                )
            found, snapshot = _restore_problems(
                where, c, mounts, snapshots, digests.get(str(c.get("image", "")))
            )
            problems += found
            if snapshot is None or privileged or extra:
                continue
            want = {SNAPSHOT_DIGEST_ENV: snapshot.manifest_digest, IMAGE_DIGEST_ENV: snapshot.base_digest}
            problems += _pin(where, c, env, want, patch if mutate else None, (*spec_path, field, str(j)))
            notes.append(
                f"{where}: restore of snapshot {snapshot.manifest_digest} admitted with {', '.join(sorted(added))}"
            )
    return CacheDecision(tuple(problems), tuple(notes), tuple(patch))
