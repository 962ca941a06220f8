"""``kernelbake capture collect``: what a running replica's caches gained, as a cache delta.

Runs in the replica (``docker exec``, ``kubectl exec``) or in a sidecar that shares the cache
volume. The live cache root is diffed against the manifest the image pins (the same diff
serve's start-up report counts as "new files"): every regular file under a cache kind's
directory that the manifest does not list is the delta. Refused, and listed, rather than
captured: a symlink or anything but a regular file, a file outside the kind directories, and a
baked file whose bytes changed (a delta never replaces a baked file). The delta is written to
an empty directory as ``delta.json`` and the files at their bundle-relative paths, each hashed
as it is copied; ``delta.json`` is written last, so a directory without it is not a delta.

Such a delta is the replica's bytes (origin ``replica``): whatever could write into the cache
root chose them, and only a policy with ``unsafe_replica_deltas`` accepts it. ``record``
(``capture.record``) is the safe half: the same diff, kept as claims (engine keys, paths,
sha256s) beside the request classes that missed, for ``capture rebuild`` to compile again in a
trusted build; in that build, ``collect`` takes what the rebuild compiled.
"""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path

from kernelbake.contract.delta import DELTA_MANIFEST, MAX_BYTES, MAX_FILES, DeltaFile, DeltaManifest
from kernelbake.contract.layout import MANIFEST, CacheKind
from kernelbake.contract.manifest import Manifest
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput
from kernelbake.runtime import pin
from kernelbake.runtime.bundle import copy_file, file_sha256
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.integrity import walk_sorted

_KINDS = {k.value: k for k in CacheKind}
# Listed in the refusals at most this many times; the count says the rest.
SHOWN = 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class Collected:
    out: Path | None  # None: nothing new, nothing written
    delta: DeltaManifest
    refused: tuple[str, ...]  # path: why, for what was not captured

    def lines(self) -> list[str]:
        totals = self.delta.totals()
        if self.out is None:
            head = ["nothing to capture: 0 new files in the cache root since the image's bundle"]
        else:
            kinds = ", ".join(f"{k} {t['files']} ({t['bytes']} B)" for k, t in sorted(totals.items()))
            head = [f"captured {len(self.delta.files)} new files into {self.out}: {kinds}"]
        shown = [f"refused {r}" for r in self.refused[:SHOWN]]
        if len(self.refused) > SHOWN:
            shown.append(f"refused {len(self.refused) - SHOWN} more")
        return head + shown


def _pinned(env: RuntimeEnv) -> tuple[Manifest, str]:
    try:
        data = env.pinned_manifest.read_bytes()
    except OSError as exc:
        raise BadInput(
            f"{env.pinned_manifest}: cannot read the image's pinned manifest ({exc.strerror}); "
            "capture runs in a kernelbake image (or a sidecar from it)"
        ) from None
    return Manifest.from_json(data.decode(errors="replace"), source=str(env.pinned_manifest)), pin.digest(
        data
    )


def _walk(root: Path, manifest: Manifest, refused: list[str]) -> list[tuple[str, CacheKind]]:
    """The new regular files under the kind directories, sorted; ``refused`` gains the rest."""
    baked = {f.path: f for f in manifest.files}
    skip = {*manifest.logs, MANIFEST}
    found: list[tuple[str, CacheKind]] = []
    for p, rel, dirs in walk_sorted(root):
        st = p.lstat()
        top = rel.split("/")[0]
        kind = _KINDS.get(top)
        if stat.S_ISDIR(st.st_mode):
            if p.parent == root and kind is None:
                refused.append(f"{rel}/: not a cache kind's directory")
                dirs.remove(p.name)
            continue
        if rel in skip:
            continue
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            refused.append(f"{rel}: a {'symlink' if stat.S_ISLNK(st.st_mode) else 'special file'}")
            continue
        if kind is None:
            refused.append(f"{rel}: not under a cache kind's directory")
            continue
        if (entry := baked.get(rel)) is not None:
            if st.st_size != entry.size or file_sha256(p) != entry.sha256:
                refused.append(f"{rel}: a baked file whose bytes changed; a delta never replaces one")
            continue
        found.append((rel, kind))
    return sorted(found)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scan:
    target: TargetConfig
    base: str  # sha256 of the pinned manifest
    root: Path
    found: list[tuple[str, CacheKind]]
    refused: list[str]


def scan(env: RuntimeEnv, root: Path | None) -> Scan:
    """The new files of ``root`` (the target's cache root by default) against the pinned
    manifest; ``BadInput`` for a foreign bundle or more than a delta may hold."""
    target = TargetConfig.load(env.target_file)
    manifest, base = _pinned(env)
    if manifest.key != target.key:
        raise BadInput(
            f"{env.pinned_manifest}: built for key {manifest.key.digest}, target.json says "
            f"{target.key.digest}; this is not one image's bundle"
        )
    root = root or Path(target.cache_root)
    if not root.is_dir():
        raise BadInput(f"{root}: no cache root to capture from")
    refused: list[str] = []
    found = _walk(root, manifest, refused)
    sizes = [(root / rel).lstat().st_size for rel, _ in found]
    if len(found) > MAX_FILES or sum(sizes) > MAX_BYTES:
        raise BadInput(
            f"{root}: {len(found)} new files, {sum(sizes)} B: more than a delta may hold "
            f"({MAX_FILES} files, {MAX_BYTES} B); nothing was written"
        )
    return Scan(target=target, base=base, root=root, found=found, refused=refused)


def collect(env: RuntimeEnv, out: Path, *, root: Path | None = None, replica: str = "") -> Collected:
    """The delta of ``root`` (the target's cache root by default) against the pinned manifest,
    written to ``out`` (absent or empty). Raises ``BadInput`` for a foreign bundle, an ``out``
    that holds anything, or a delta over the bounds, before writing a file."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"{out}: not an empty directory; capture writes a delta only into a new or empty one")
    seen = scan(env, root)
    target, base, root, found, refused = seen.target, seen.base, seen.root, seen.found, seen.refused
    if not found:
        empty = DeltaManifest(key=target.key, base_image=None, base_manifest=base, files=(), replica=replica)
        return Collected(out=None, delta=empty, refused=tuple(refused))
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for rel, kind in found:
        try:
            size, sha = copy_file(root, rel, out)
        except OSError as exc:
            raise BadInput(
                f"{root / rel}: cannot be copied ({exc.strerror or exc}); {out} is incomplete: remove it"
            ) from None
        files.append(DeltaFile(path=rel, size=size, sha256=sha, kind=kind))
    delta = DeltaManifest(
        key=target.key, base_image=None, base_manifest=base, files=tuple(files), replica=replica
    )
    (out / DELTA_MANIFEST).write_text(delta.to_json())
    return Collected(out=out, delta=delta, refused=tuple(refused))
