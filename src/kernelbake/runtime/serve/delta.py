"""A cache delta at start: merged into the engine's caches only when every check passes.

The delta is mounted at ``DELTA_ROOT`` (an image volume of the delta artifact). Before the
engine opens any cache, and only on a warm start from the baked caches, ``serve`` checks:

1. nothing is mounted inside ``DELTA_ROOT`` (``/proc/self/mountinfo``): every file comes from the
   delta's own volume, not from a pod that mounted files over it and pinned those;
2. ``delta.json`` is the one whoever created the pod verified: its sha256 equals
   ``$KERNELBAKE_DELTA_DIGEST`` (admission sets it after the signature, the key and the base
   image digest; kernelbake cannot tell who set it, so it is as trustworthy as the pod spec,
   like ``$KERNELBAKE_MANIFEST_DIGEST``);
3. its key is target.json's, and its base manifest is the manifest this image pins;
4. its files lie in the engine's cache kinds, none gives a baked path other bytes (nor a file
   already in the cache root), and every file's size and sha256 match.

Then its files are copied into the cache root the engine will use (each hashed again as it is
copied). Any check failing: nothing is copied, a copy failing half-way: what was copied is
removed; either way the start goes on from the baked caches alone and says why.

The merge line names where the bytes come from (delta.json's ``origin``): rebuilt by which
builder, or a replica's own bytes, which only a policy with ``unsafe_replica_deltas`` admits
(serve cannot see the policy, so it says UNSAFE each time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from kernelbake.contract.delta import (
    DELTA_DIGEST_ENV,
    DELTA_MANIFEST,
    MAX_MANIFEST_BYTES,
    DeltaFile,
    DeltaManifest,
    Layering,
    Origin,
    base_problems,
)
from kernelbake.contract.layout import CacheKind
from kernelbake.contract.manifest import FileEntry, Manifest
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput
from kernelbake.runtime import pin, trusted
from kernelbake.runtime.bundle import copy_file
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.integrity import NotPlain, file_problems, open_beneath, read_file

_SHOWN = 3


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeltaOutcome:
    where: Path
    used: bool
    # Why it was not used (empty when it was).
    reason: str = ""
    digest: str | None = None
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    # "verified": every file's sha256 was checked against delta.json, itself pinned.
    verified: bool = False
    origin: str = ""  # delta.json's, once read
    builder: str = ""  # who rebuilt it, for a rebuilt delta

    def provenance(self) -> str:
        if self.origin == Origin.REBUILT.value:
            return f"rebuilt by {self.builder}"
        return (
            "UNSAFE: the bytes a replica wrote, not rebuilt (admitted only by a policy with "
            "verify.unsafe_replica_deltas)"
        )

    def line(self) -> str:
        if self.used:
            return (
                f"cache delta {self.digest} merged into the caches ({self.provenance()}): {self.files} files "
                f"({self.bytes} B), sha256 of every file checked in {self.seconds:.2f} s"
            )
        return f"WARNING: cache delta at {self.where} not used, starting from the baked caches alone: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {
            "where": str(self.where),
            "used": self.used,
            "reason": self.reason,
            "digest": self.digest,
            "files": self.files,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "verified": self.verified,
            "origin": self.origin,
            "builder": self.builder,
        }


def present(env: RuntimeEnv) -> bool:
    """Whether this start has a delta to judge (one mounted, or one the pod says it pinned)."""
    return env.delta_digest is not None or (env.delta_root / DELTA_MANIFEST).exists()


def _refused(env: RuntimeEnv, why: str, digest: str | None = None) -> DeltaOutcome:
    return DeltaOutcome(where=env.delta_root, used=False, reason=why, digest=digest)


def _read(env: RuntimeEnv) -> tuple[DeltaManifest, str]:
    """delta.json, pinned; ``BadInput`` says why it cannot be used."""
    where = env.delta_root / DELTA_MANIFEST
    # The pin says which delta.json to accept, not whose: a pod that mounts its own files
    # inside the delta's volume (subPath) and pins them would pass every check below.
    if inside := trusted.mounts_inside(env.delta_root):
        raise BadInput(
            "; ".join(inside[:_SHOWN])
            + (f"; and {len(inside) - _SHOWN} more" if len(inside) > _SHOWN else "")
        )
    try:
        with open_beneath(env.delta_root, DELTA_MANIFEST) as fd:
            if os.fstat(fd).st_size > MAX_MANIFEST_BYTES:
                raise BadInput(f"{where} is larger than a delta manifest may be ({MAX_MANIFEST_BYTES} B)")
        data = read_file(env.delta_root, DELTA_MANIFEST)
    except FileNotFoundError:
        raise BadInput(f"${DELTA_DIGEST_ENV} is set but {where} is missing (mount the delta there)") from None
    except OSError as exc:
        raise BadInput(f"{where} cannot be read ({exc.strerror or exc})") from None
    found = pin.digest(data)
    if env.delta_digest is None:
        raise BadInput(
            f"nothing pins the delta: ${DELTA_DIGEST_ENV} is unset, so {where} ({found}) cannot be tied to a "
            f"verified signature; let admission pin it, or set ${DELTA_DIGEST_ENV} to the digest you verified"
        )
    if found != env.delta_digest:
        raise BadInput(f"{where} is {found}, but ${DELTA_DIGEST_ENV} pins {env.delta_digest}")
    return DeltaManifest.from_json(data, source=str(where)), found


def pinned_paths(env: RuntimeEnv) -> frozenset[str]:
    """The files of the delta this start pins, which the cache root may hold already (merged
    by an earlier start of this container); none where no delta is pinned and readable."""
    if not present(env):
        return frozenset()
    try:
        delta, _ = _read(env)
    except BadInput:
        return frozenset()
    return frozenset(f.path for f in delta.files)


def leftovers(
    root: Path, paths: frozenset[str], manifest: Manifest, outcome: DeltaOutcome | None
) -> list[str]:
    """Files of a delta that is not used, found in ``root`` and not baked: a restart's earlier
    merge, which nothing has vouched for this time (the preflight starts cold on them)."""
    if outcome is not None and outcome.used:
        return []
    baked = {f.path for f in manifest.files}
    why = outcome.reason if outcome else "none is mounted"
    return [
        f"{p}: a file of a cache delta that is not used this time ({why})"
        for p in sorted(paths - baked)
        if os.path.lexists(root / p)
    ]


def _check(
    delta: DeltaManifest,
    target: TargetConfig,
    manifest: Manifest,
    manifest_data: bytes,
    kinds: set[CacheKind],
) -> list[str]:
    # This image: target.json's key and the manifest it pins; its own digest it cannot know.
    here = Layering(
        key=target.key, manifest=pin.digest(manifest_data), files={f.path: f.sha256 for f in manifest.files}
    )
    problems = base_problems(Layering.of(delta), here, named="this image")
    if foreign := sorted({f.kind.value for f in delta.files if f.kind not in kinds}):
        problems.append(f"the delta holds kinds this engine does not cache: {', '.join(foreign)}")
    if logs := sorted(set(manifest.logs) & {f.path for f in delta.files}):
        problems.append(f"the delta lists the engine's logs: {', '.join(logs[:_SHOWN])}")
    return problems


def _occupied(root: Path, delta: DeltaManifest, baked: set[str]) -> list[str]:
    """Delta files whose path the cache root already holds, with other bytes (not baked ones)."""
    return [
        f"{f.path}: the cache root already holds other bytes there"
        for f in delta.files
        if f.path not in baked and os.path.lexists(root / f.path) and file_problems(root, [_entry(f)])
    ]


def _entry(f: DeltaFile) -> FileEntry:
    return FileEntry(f.path, f.size, f.sha256, f.kind)


def apply(
    env: RuntimeEnv,
    target: TargetConfig,
    manifest: Manifest,
    manifest_data: bytes,
    root: Path,
    kinds: set[CacheKind],
) -> DeltaOutcome:
    """Check the mounted delta and merge it into ``root`` (the engine's cache root, already
    checked); the outcome says what happened. Call only when ``present(env)``."""
    started = time.monotonic()
    try:
        delta, digest = _read(env)
    except BadInput as exc:
        return _refused(env, str(exc))
    if problems := _check(delta, target, manifest, manifest_data, kinds):
        return _refused(env, "; ".join(problems), digest)
    baked = {f.path for f in manifest.files}
    new = [f for f in delta.files if f.path not in baked]
    if bad := file_problems(env.delta_root, [_entry(f) for f in new]):
        shown = "; ".join(bad[:_SHOWN]) + (f"; and {len(bad) - _SHOWN} more" if len(bad) > _SHOWN else "")
        return _refused(env, f"its files are not what delta.json records: {shown}", digest)
    if occupied := _occupied(root, delta, baked):
        return _refused(env, "; ".join(occupied[:_SHOWN]), digest)
    copied: list[Path] = []
    try:
        for f in new:
            if (root / f.path).exists():
                continue  # the same bytes already (``_occupied``)
            copied.append(root / f.path)
            size, sha = copy_file(env.delta_root, f.path, root)
            if (size, sha) != (f.size, f.sha256):
                raise BadInput(f"{f.path} changed while it was copied (sha256 {sha})")
    except (OSError, NotPlain, BadInput) as exc:
        for p in copied:
            with contextlib.suppress(OSError):
                p.unlink()
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return _refused(env, f"copying into {root} failed ({why}); what was copied is removed", digest)
    return DeltaOutcome(
        where=env.delta_root,
        used=True,
        digest=digest,
        files=len(new),
        bytes=sum(f.size for f in new),
        seconds=time.monotonic() - started,
        verified=True,
        origin=delta.origin.value,
        builder=delta.rebuild.builder if delta.rebuild else "",
    )
