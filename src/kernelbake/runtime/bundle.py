"""The cache bundle: every cache under one root, one directory per kind, plus a manifest.

    <root>/manifest.json
    <root>/<kind>/...        e.g. inductor/, triton/, vllm/, flashinfer/

The manifest lists every file (path, size, sha256) and per-kind totals, with the key the
caches were built for. Its digest goes into the attestation, so a verifier can tie the bytes
in the image to a signature.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kernelbake.errors import BadInput
from kernelbake.key import CacheKey, parse_key

MANIFEST = "manifest.json"
# A hashed variable that was not set at compile time (so setting it later is a change).
UNSET = "<unset>"
SCHEMA = 1


class CacheKind(enum.Enum):
    INDUCTOR = "inductor"  # TORCHINDUCTOR_CACHE_DIR (FX graph, AOTAutograd, compiled C++/PTX)
    TRITON = "triton"  # TRITON_CACHE_DIR
    VLLM = "vllm"  # VLLM_CACHE_ROOT (torch.compile artifacts, AOT)
    FLASHINFER = "flashinfer"  # FLASHINFER_WORKSPACE_BASE (JIT modules, autotune)
    DEEPGEMM = "deepgemm"  # DG_JIT_CACHE_DIR
    TILELANG = "tilelang"  # TILELANG_CACHE_DIR
    CUTE_DSL = "cute-dsl"  # CUTE_DSL_CACHE_DIR


@dataclasses.dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    kind: CacheKind


@dataclasses.dataclass(frozen=True, kw_only=True)
class Manifest:
    key: CacheKey
    files: tuple[FileEntry, ...]
    # Values of the engine's hashed env vars during compilation (absent = unset).
    hashed_env: tuple[tuple[str, str], ...] = ()
    # Free-form facts from the compile step (timings, peak memory, hit evidence).
    compile_report: tuple[tuple[str, Any], ...] = ()

    def totals(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for f in self.files:
            t = out.setdefault(f.kind.value, {"files": 0, "bytes": 0})
            t["files"] += 1
            t["bytes"] += f.size
        return out

    def to_json(self) -> str:
        doc = {
            "schema": SCHEMA,
            "key": str(self.key),
            "key_digest": self.key.digest,
            "kinds": self.totals(),
            "hashed_env": dict(self.hashed_env),
            "compile_report": dict(self.compile_report),
            "files": [
                {"path": f.path, "size": f.size, "sha256": f.sha256, "kind": f.kind.value} for f in self.files
            ],
        }
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = MANIFEST) -> Manifest:
        try:
            doc = json.loads(text)
            if doc.get("schema") != SCHEMA:
                raise BadInput(f"{source}: manifest schema {doc.get('schema')!r} is not {SCHEMA}")
            files = tuple(
                FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"]), CacheKind(f["kind"]))
                for f in doc["files"]
            )
            return cls(
                key=parse_key(doc["key"]),
                files=files,
                hashed_env=tuple(sorted((str(k), str(v)) for k, v in doc.get("hashed_env", {}).items())),
                compile_report=tuple(sorted(doc.get("compile_report", {}).items())),
            )
        except BadInput:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadInput(f"{source}: not a valid cache manifest ({type(exc).__name__}: {exc})") from None


def kind_dir(root: Path, kind: CacheKind) -> Path:
    return root / kind.value


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def scan(root: Path, kinds: Iterable[CacheKind]) -> tuple[FileEntry, ...]:
    """Every regular file under each kind's directory, sorted; symlinks are refused because
    COPY would follow or break them and the manifest could not vouch for their target."""
    entries = []
    for kind in kinds:
        base = kind_dir(root, kind)
        if not base.exists():
            continue
        for dirpath, _dirs, names in os.walk(base):
            for name in names:
                p = Path(dirpath) / name
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
) -> Manifest:
    manifest = Manifest(
        key=key,
        files=scan(root, kinds),
        hashed_env=tuple(sorted((hashed_env or {}).items())),
        compile_report=tuple(sorted((report or {}).items())),
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


def manifest_digest(root: Path) -> str:
    return "sha256:" + _sha256(root / MANIFEST)
