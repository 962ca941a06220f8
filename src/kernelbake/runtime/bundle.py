"""The cache bundle on disk: every cache under one root, one directory per kind, plus a
manifest (``kernelbake.contract.layout`` and ``kernelbake.contract.manifest``).

    <root>/manifest.json
    <root>/<kind>/...        e.g. inductor/, triton/, vllm/, flashinfer/

Here the manifest is written from the files and the files are checked against it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kernelbake.contract.key import CacheKey
from kernelbake.contract.layout import MANIFEST, CacheKind, kind_dir
from kernelbake.contract.manifest import FileEntry, Manifest, RankEntry
from kernelbake.errors import BadInput
from kernelbake.runtime.integrity import open_beneath, read_file


def file_sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def scan(
    root: Path, kinds: Iterable[CacheKind], *, logs: frozenset[str] = frozenset()
) -> tuple[tuple[FileEntry, ...], tuple[str, ...]]:
    """Every regular file under each kind's directory, sorted; symlinks are refused because
    COPY would follow or break them and the manifest could not vouch for their target.
    Files named in ``logs`` (logs the engine appends to, which nothing loads) are left out of
    the first list and returned, by path, in the second."""
    entries = []
    kept: list[str] = []
    for kind in kinds:
        base = kind_dir(root, kind)
        if not base.exists():
            continue
        for dirpath, _dirs, names in os.walk(base):
            for name in names:
                p = Path(dirpath) / name
                if name in logs and not p.is_symlink():
                    kept.append(p.relative_to(root).as_posix())
                    continue
                if p.is_symlink():
                    raise BadInput(f"cache bundle: {p} is a symlink; caches must be plain files")
                rel = p.relative_to(root).as_posix()
                entries.append(FileEntry(rel, p.stat().st_size, file_sha256(p), kind))
    return tuple(sorted(entries, key=lambda e: e.path)), tuple(sorted(kept))


def write_manifest(
    root: Path,
    key: CacheKey,
    kinds: Iterable[CacheKind],
    *,
    hashed_env: Mapping[str, str] | None = None,
    report: Mapping[str, Any] | None = None,
    ranks: Iterable[RankEntry] = (),
    logs: frozenset[str] = frozenset(),
) -> Manifest:
    files, kept = scan(root, kinds, logs=logs)
    manifest = Manifest(
        key=key,
        files=files,
        logs=kept,
        hashed_env=tuple(sorted((hashed_env or {}).items())),
        compile_report=tuple(sorted((report or {}).items())),
        ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
    )
    (root / MANIFEST).write_text(manifest.to_json())
    return manifest


def readable_by_all(root: Path) -> None:
    """Every file and directory of the bundle readable (directories also searchable) by any
    uid: engines write some cache files 0600 (vLLM's model info), and an image run with
    ``--user`` would then find its own caches unreadable and start cold. Only read bits are
    added; nothing becomes writable or executable that was not."""
    for dirpath, dirs, files in os.walk(root):
        for names, bits in ((files, 0o444), (dirs, 0o555)):
            for name in names:
                p = Path(dirpath) / name
                if not p.is_symlink():
                    p.chmod(p.stat().st_mode | bits)
    root.chmod(root.stat().st_mode | 0o555)


def load_manifest(root: Path) -> tuple[Manifest, bytes]:
    """The manifest and its exact bytes (parsed from the same read that is hashed against the
    pin). A symlink at its path is refused: the manifest must be a file of the cache root."""
    path = root / MANIFEST
    try:
        data = read_file(root, MANIFEST)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read cache manifest: {exc.strerror or exc}") from None
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not a cache manifest (byte {exc.start} is not UTF-8)") from None
    return Manifest.from_json(text, source=str(path)), data


def read_manifest(root: Path) -> Manifest:
    return load_manifest(root)[0]


def copy_file(root: Path, rel: str, dest: Path) -> tuple[int, str]:
    """Copies ``rel`` (never through a symlink, never onto one), keeping its mode and times;
    its size and sha256. The times are kept because a copied cache must read as the baked one:
    some engine caches compare a file's mtime with their own records (and the init-container
    recipe promises a copy that keeps them, like ``cp -a``)."""
    h = hashlib.sha256()
    size = 0
    with open_beneath(root, rel) as src:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        st = os.fstat(src)
        out = os.open(
            target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, st.st_mode & 0o777
        )
        try:
            while chunk := os.read(src, 1 << 20):
                h.update(chunk)
                size += len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)
    return size, h.hexdigest()


def copy_bundle(root: Path, manifest: Manifest, data: bytes, dest: Path) -> int:
    """Copies what the manifest lists from ``root`` to ``dest``, hashing each file as it goes,
    then the engine's logs and the manifest (``data``: the bytes that were checked) last.
    Nothing else is copied: no unlisted file, and no symlink is followed. Returns the number
    of cache files copied; the first file that differs from the manifest raises ``BadInput``."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = 0
    for entry in manifest.files:
        try:
            size, digest = copy_file(root, entry.path, dest)
        except OSError as exc:
            raise BadInput(f"{root / entry.path}: cannot be copied ({exc.strerror or exc})") from None
        if (size, digest) != (entry.size, entry.sha256):
            raise BadInput(
                f"{entry.path}: sha256 {digest} ({size} B) but the manifest records "
                f"{entry.sha256} ({entry.size} B)"
            )
        copied += 1
    for log in manifest.logs:
        # A log is appended to, never loaded: copied when it is a plain file, else left out.
        with contextlib.suppress(OSError):
            copy_file(root, log, dest)
    # Every kind directory the root has, those of kinds that compiled nothing included: the
    # preflight keeps caches in place only where it can write into each kind's directory, so
    # a copy without them (an emptyDir that seed-cache filled) would be copied again to scratch.
    for kind in CacheKind:
        source = kind_dir(root, kind)
        if kind in {f.kind for f in manifest.files} or (source.is_dir() and not source.is_symlink()):
            kind_dir(dest, kind).mkdir(parents=True, exist_ok=True)
    tmp = dest / f".{MANIFEST}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.write_bytes(data)
    with contextlib.suppress(OSError):
        st = (root / MANIFEST).lstat()
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    tmp.replace(dest / MANIFEST)
    return copied
