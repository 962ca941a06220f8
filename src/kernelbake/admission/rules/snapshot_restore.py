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
- adds no capability beyond the restore set, SYS_CHROOT and SETGID (``SNAPSHOT_CAPABILITIES``: the recipe
  drops ALL and adds those five back, the set its snapshot was taken with), is not privileged
  (which is every capability, so a privileged container asks for the set too), and is no
  ephemeral container; its pod shares no
  namespace with the node or across its containers (``hostPID``, ``hostNetwork``, ``hostIPC``,
  ``shareProcessNamespace``: ``_HOST_NAMESPACES`` says what each would open); its pod mounts
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
here (Pod Security admission is where their capabilities are limited). ``decide`` is the pure
core: it takes the verified snapshots by volume name and the verified image of each container
image, which ``check`` reads from the review's facts.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Collection, Mapping
from typing import Any

from kernelbake.admission.pod import Container, ImageVolume, Mount, Pod
from kernelbake.admission.rules.facts import Facts, Rule
from kernelbake.admission.rules.roots import root_mounts
from kernelbake.admission.rules.shape import Denial, Verdict, append, verdict
from kernelbake.admission.rules.sites import Resolved
from kernelbake.admission.subject import Keyed, SnapshotLike
from kernelbake.contract.snapshot import (
    IMAGE_DIGEST_ENV,
    RESTORE_CAPABILITIES,
    SNAPSHOT_CAPABILITIES,
    SNAPSHOT_DIGEST_ENV,
    SNAPSHOT_ROOT,
    is_volatile,
)

_PINNED = (SNAPSHOT_DIGEST_ENV, IMAGE_DIGEST_ENV)
# A restoring container gets SYS_ADMIN and NET_ADMIN in its own namespaces; in one it shares
# with the node or the pod's other containers they reach further, and CRIU gives the tree its
# recorded pids back, which must be free (serve's gate refuses a restore where one is taken).
_HOST_NAMESPACES = {
    "hostPID": "SYS_ADMIN over the node's processes is the node's root, and the snapshot's pids are the node's",
    "hostNetwork": "NET_ADMIN would change the node's network (CRIU's network lock writes nftables rules)",
    "hostIPC": "SYS_ADMIN would reach the node's IPC objects",
    "shareProcessNamespace": "the other containers' processes share the pids the snapshot's tree needs, "
    "and SYS_ADMIN reaches them",
}
_SHOWN = 160
_SNAPSHOT_SET = ", ".join(sorted(SNAPSHOT_CAPABILITIES))


def check(facts: Facts) -> Verdict:
    snapshots: dict[str, SnapshotLike] = {}
    images: dict[str, Keyed] = {}
    for g, found in facts.resolved:
        if not isinstance(found, Resolved):
            continue
        if isinstance(g.site, Container):
            images[g.site.image] = found.subject
        elif (snapshot := facts.subjects.snapshots.get(found.target)) is not None:
            snapshots[g.site.name] = snapshot
    governed: set[str] = set()
    for g in facts.governed:
        if not isinstance(g.site, ImageVolume):
            governed.add(g.site.image)
    return decide(facts.pod, snapshots, images, governed=governed, mutate=facts.mutate)


def decide(
    pod: Pod,
    snapshots: Mapping[str, SnapshotLike],
    images: Mapping[str, Keyed],
    *,
    governed: Collection[str] | None = None,
    mutate: bool,
) -> Verdict:
    """Problems, notes and (``mutate``) the patch that pins each restore for ``serve``.
    ``snapshots``: volume name → verified snapshot; ``images``: container image → its verified
    image; ``governed``: the container images the policy governs (None: every container is
    judged). A container of another image is judged only when it mounts a verified snapshot or
    sets the pins."""
    denials: list[Denial] = []
    notes: list[str] = []
    patch: list[dict[str, Any]] = []
    restores, privileged = 0, []
    pod_unconfined = _unconfined(pod.spec)
    for c in pod.containers:
        added, unconfined, whole = _asks(c.obj, pod_unconfined)
        privileged += [c.where] if whole else []
        mounts, wrong = root_mounts(
            c, snapshots, SNAPSHOT_ROOT, what="snapshot", use="restores a snapshot from"
        )
        pins = [e for e in c.env if e.get("name") in _PINNED] if c.env else []
        if governed is not None and c.image not in governed and not mounts and not pins:
            continue
        denials += wrong
        # Privileged is every capability, the restore set among them.
        if not (added & RESTORE_CAPABILITIES or unconfined or whole):
            if pins or mounts:
                # Otherwise it has nothing to say.
                denials += _without_restore(c, pins, mounts, notes)
            continue
        found, note = _restoring(
            c, pod, added, whole, mounts, pins, snapshots, images.get(c.image), patch if mutate else None
        )
        denials += found
        if note:
            restores += 1
            notes.append(note)
    if restores and privileged:
        # Whatever its image: it could enter the restoring container (or the node) and change
        # what is restored, which serve trusts unhashed on a pulled image volume.
        denials.append(
            Denial(
                ", ".join(privileged[:4]),
                "privileged beside a snapshot restore; no container of a restoring pod may be privileged",
            )
        )
    return verdict(denials, notes, patch)


def _restoring(
    c: Container,
    pod: Pod,
    added: set[str],
    whole: bool,
    mounts: list[Mount],
    pins: list[Mapping[str, Any]],
    snapshots: Mapping[str, SnapshotLike],
    image: Keyed | None,
    patch: list[dict[str, Any]] | None,
) -> tuple[list[Denial], str]:
    """A container that asks for the restore set: its denials, or none and the note that its
    restore is admitted (its pins patched in where ``patch`` is given)."""
    if c.field == "ephemeralContainers":
        return [
            Denial(c.where, "asks for the restore capabilities; serve restores only in a pod's containers")
        ], ""
    found, snapshot = _restore(c, pod, added, whole, mounts, snapshots, image)
    if snapshot is None or found:
        return found, ""
    want = {SNAPSHOT_DIGEST_ENV: snapshot.manifest_digest, IMAGE_DIGEST_ENV: snapshot.base_digest}
    pinned = _pin(c, pins, want, patch)
    if pinned:
        return pinned, ""
    return (
        [],
        f"{c.where}: restore of snapshot {snapshot.manifest_digest} admitted with {', '.join(sorted(added))}",
    )


def _dict(value: Any) -> Mapping[str, Any]:
    """``value`` where the pod spec has an object there; else nothing (a pod author's junk is
    judged as absent here, and its shape is the API server's to refuse)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _cap(name: object) -> str:
    return str(name).upper().removeprefix("CAP_")


def _unconfined(spec: Mapping[str, Any]) -> bool:
    """Whether the pod's own seccomp profile, which a container without one inherits, is
    Unconfined."""
    sc = spec.get("securityContext")
    if not (isinstance(sc, dict) and sc):
        # Most pods set none (or an empty one): nothing is Unconfined.
        return False
    return _dict(_dict(sc).get("seccompProfile")).get("type") == "Unconfined"


def _asks(container: Mapping[str, Any], pod_unconfined: bool) -> tuple[set[str], bool, bool]:
    """(capabilities added, seccomp unconfined, privileged) of ``container`` in a pod whose own
    profile is Unconfined or not (``_unconfined``); the container's seccomp profile, else the pod's."""
    sc = _dict(container.get("securityContext"))
    if not sc:
        # Most containers set none: the pod's profile is all there is to ask.
        return set(), pod_unconfined, False
    added = {_cap(c) for c in _list(_dict(sc.get("capabilities")).get("add"))}
    profile = _dict(sc.get("seccompProfile"))
    unconfined = profile.get("type") == "Unconfined" if profile else pod_unconfined
    return added, unconfined, sc.get("privileged") is True


def _without_restore(
    c: Container, pins: list[Mapping[str, Any]], mounts: list[Mount], notes: list[str]
) -> list[Denial]:
    """A container that asks for none of the restore set: it may not set the pins."""
    if pins:
        names = sorted({str(e["name"]) for e in pins})
        return [
            Denial(
                c.where,
                f"sets ${' and $'.join(names)} without the restore it pins",
                "only admission sets them, for a snapshot it verified",
            )
        ]
    if mounts:
        notes.append(f"{c.where}: mounts a snapshot without the restore capabilities; serve starts baked")
    return []


def _restore(
    c: Container,
    pod: Pod,
    added: set[str],
    privileged: bool,
    mounts: list[Mount],
    snapshots: Mapping[str, SnapshotLike],
    image: Keyed | None,
) -> tuple[list[Denial], SnapshotLike | None]:
    """What is wrong with a container that asks for the restore set, and the snapshot it restores."""
    wrong: list[Denial] = []
    if privileged:
        wrong.append(
            Denial(
                c.where,
                f"privileged grants every capability; a restore needs only {_SNAPSHOT_SET} (drop ALL, add those) "
                "and seccomp Unconfined",
            )
        )
    # What every runtime grants by default is no more than it had, and a container that drops
    # ALL adds it back (the recipe: SYS_CHROOT and SETGID, which the restore needs).
    if extra := sorted(added - SNAPSHOT_CAPABILITIES):
        wrong.append(Denial(c.where, f"adds {', '.join(extra)} beyond the restore set ({_SNAPSHOT_SET})"))
    if pod.host_paths:
        wrong.append(
            Denial(
                c.where,
                f"asks for the restore capabilities in a pod with hostPath volumes ({', '.join(pod.host_paths[:4])}); "
                "with SYS_ADMIN a container could write through one into the node's image store, where the "
                "snapshot's files are",
            )
        )
    if shared := [f for f in _HOST_NAMESPACES if pod.spec.get(f) is True]:
        wrong.append(
            Denial(
                c.where,
                f"asks for the restore capabilities in a pod with {', '.join(f + ': true' for f in shared)}; "
                f"{'; '.join(_HOST_NAMESPACES[f] for f in shared)}",
            )
        )
    found, snapshot = _restore_problems(c, mounts, snapshots, image)
    wrong += found
    if snapshot is not None:
        wrong += _args_problems(c, snapshot)
        wrong += _env_problems(c, snapshot)
    return wrong, snapshot


def _restore_problems(
    c: Container, mounts: list[Mount], snapshots: Mapping[str, SnapshotLike], image: Keyed | None
) -> tuple[list[Denial], SnapshotLike | None]:
    if len(mounts) != 1:
        return [
            Denial(
                c.where,
                f"asks for the restore capabilities but mounts {len(mounts)} verified snapshots; they are "
                f"granted only to restore one, at {SNAPSHOT_ROOT}",
            )
        ], None
    snapshot = snapshots[str(mounts[0].name)]
    path = mounts[0].path
    if not isinstance(path, str) or posixpath.normpath(path) != SNAPSHOT_ROOT:
        return [
            Denial(c.where, f"the snapshot is mounted at {path!r}; serve restores only from {SNAPSHOT_ROOT}")
        ], None
    if image is None or image.digest != snapshot.base_digest:
        runs = image.digest if image is not None else repr(c.obj.get("image"))
        return [
            Denial(
                c.where,
                f"the snapshot was taken from {snapshot.base_digest}, but the container runs {runs}; a restore "
                "is admitted only into its own image, by digest",
            )
        ], None
    if image.key != snapshot.key:
        return [
            Denial(
                c.where,
                f"the snapshot's cache key is {snapshot.key.digest}, the image's is {image.key.digest}",
            )
        ], None
    return [], snapshot


def _shown(text: str) -> str:
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}… ({len(text)} characters)"


def _args_problems(c: Container, snapshot: SnapshotLike) -> list[Denial]:
    """``serve``'s arguments as the key records them: the image's entrypoint is
    ``kernelbake serve`` and a container's ``args`` are what follows it."""
    if c.obj.get("command"):
        return [
            Denial(
                c.where,
                "sets command; a restore runs the image's entrypoint (kernelbake serve) with the snapshot's "
                "arguments in args, so leave command unset",
            )
        ]
    args = c.obj.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return [Denial(c.where, "args must be a list of strings")]
    if any("$(" in a for a in args):
        return [
            Denial(
                c.where,
                "args refer to variables ($(NAME)), which the kubelet expands and admission cannot know",
                "write the arguments the snapshot was taken with",
            )
        ]
    recorded = snapshot.snapshot_key.serve_args
    if json.dumps(args) != recorded:
        return [
            Denial(
                c.where,
                f"serve args {_shown(json.dumps(args))} here, {_shown(recorded)} recorded; serve would start "
                "baked, with the restore's capabilities",
            )
        ]
    return []


def _env_problems(c: Container, snapshot: SnapshotLike) -> list[Denial]:
    """Each variable the container sets, against the environment the key digests. What the image's
    ENV adds is not seen here; serve compares the whole digest."""
    recorded = snapshot.environment
    if recorded is None:
        return [
            Denial(
                c.where,
                "the snapshot's snapshot.json records no environment (taken by an older kernelbake), so "
                "admission cannot tell whether serve would restore it",
                "take it again",
            )
        ]
    problems = []
    if c.obj.get("envFrom"):
        problems.append(
            Denial(
                c.where,
                "envFrom brings variables admission cannot read, and the snapshot's key holds the environment",
                "set each with a value",
            )
        )
    for e in c.env:
        if not isinstance(e.get("name"), str) or is_volatile(e["name"]):
            continue
        name = e["name"][:80]
        if "valueFrom" in e:
            problems.append(
                Denial(
                    c.where,
                    f"${name} comes from valueFrom, which admission cannot read, and the snapshot's key holds "
                    "the environment",
                    "set it with a value",
                )
            )
        elif name not in recorded:
            problems.append(Denial(c.where, f"${name} is set here, and was not when the snapshot was taken"))
        elif recorded[name] != str(e.get("value", "")):
            problems.append(Denial(c.where, f"${name} differs from the value the snapshot was taken with"))
    return problems


def _pin(
    c: Container, pins: list[Mapping[str, Any]], want: Mapping[str, str], patch: list[dict[str, Any]] | None
) -> list[Denial]:
    """Each pin as the verification says: refused where the pod set another, patched in
    (``patch`` given) where it set none."""
    env = {str(e["name"]): e for e in pins}
    problems = []
    for name, value in want.items():
        have = env.get(name)
        if have is not None and (have.get("value") != value or "valueFrom" in have):
            problems.append(Denial(c.where, f"${name} is {have.get('value')!r}, the verified one is {value}"))
        elif have is None and patch is not None:
            append(patch, c.obj, c.at, "env", {"name": name, "value": value})
    return problems


RULE = Rule(
    "snapshot-restore",
    "a container of a governed image that asks for the restore capabilities (SYS_ADMIN, NET_ADMIN, "
    "SYS_TIME, seccomp Unconfined, or privileged) other than for a restore `serve` would make: one "
    "verified snapshot mounted whole at the snapshot root, taken from its image and cache key, the "
    "recorded args and variables, nothing beyond the set, in a pod with no hostPath, no namespace "
    "shared with the node or across its containers and no privileged container; or the snapshot pins "
    "set by the pod",
    check,
)
