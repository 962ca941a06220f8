"""The cache bundle on disk: every cache under one root, one directory per kind, plus a
manifest (``kernelbake.contract.layout`` and ``kernelbake.contract.manifest``).

    <root>/manifest.json
    <root>/<kind>/...        e.g. inductor/, triton/, vllm/, flashinfer/

Here the manifest is written from the files and the files are checked against it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kernelbake.contract.key import CacheKey
from kernelbake.contract.layout import MANIFEST, CacheKind, kind_dir
from kernelbake.contract.manifest import FileEntry, Manifest, RankEntry
from kernelbake.errors import BadInput


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def scan(
    root: Path, kinds: Iterable[CacheKind], *, logs: frozenset[str] = frozenset()
) -> tuple[FileEntry, ...]:
    """Every regular file under each kind's directory, sorted; symlinks are refused because
    COPY would follow or break them and the manifest could not vouch for their target.
    Files named in ``logs`` (logs the engine appends to, which nothing loads) are left out."""
    entries = []
    for kind in kinds:
        base = kind_dir(root, kind)
        if not base.exists():
            continue
        for dirpath, _dirs, names in os.walk(base):
            for name in names:
                p = Path(dirpath) / name
                if name in logs and not p.is_symlink():
                    continue
                if p.is_symlink():
                    raise BadInput(f"cache bundle: {p} is a symlink; caches must be plain files")
                rel = p.relative_to(root).as_posix()
                entries.append(FileEntry(rel, p.stat().st_size, _sha256(p), kind))
    return tuple(sorted(entries, key=lambda e: e.path))


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
    manifest = Manifest(
        key=key,
        files=scan(root, kinds, logs=logs),
        hashed_env=tuple(sorted((hashed_env or {}).items())),
        compile_report=tuple(sorted((report or {}).items())),
        ranks=tuple(sorted(ranks, key=lambda r: r.rank)),
    )
    (root / MANIFEST).write_text(manifest.to_json())
    return manifest


def read_manifest(root: Path) -> Manifest:
    path = root / MANIFEST
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read cache manifest: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not a cache manifest (byte {exc.start} is not UTF-8)") from None
    return Manifest.from_json(text, source=str(path))
