"""The cache manifest: every file of the bundle (path, size, sha256) and per-kind totals, with
the key the caches were built for.

Written by ``kernelbake compile`` as the image's last layer; read by the preflight, by
``inspect``, and by signing, whose attestation carries its digest so that a verifier can tie
the bytes in the image to a signature.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from typing import Any, Protocol

from kernelbake.contract import jsondoc
from kernelbake.contract.key import CacheKey, parse_key
from kernelbake.contract.layout import MANIFEST, CacheKind
from kernelbake.errors import BadInput

# A hashed variable that was not set at compile time (so setting it later is a change).
UNSET = "<unset>"
SCHEMA = 1
# How every document names bytes: a sha256 in hex, and as an OCI digest (``sha256:<hex>``).
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def bundle_path_problem(path: str, kind: CacheKind | None = None) -> str | None:
    """Why ``path`` is not a file of the bundle: every path is relative, stays inside the
    cache root (no ``..``, no absolute path, no empty or ``.`` part) and, given its kind, lies
    under that kind's directory. A manifest is data from the image or a volume; a path that
    leaves the root would have the runtime hash (and name the digest of) any file it can read."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        return "is not a relative path"
    if any(p in ("", ".", "..") for p in parts):
        return "leaves the cache root or is not normalised (an empty, '.' or '..' part)"
    if kind is not None and (len(parts) < 2 or parts[0] != kind.value):
        return f"is not under its kind's directory {kind.value}/"
    return None


@dataclasses.dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str
    kind: CacheKind


@dataclasses.dataclass(frozen=True)
class RankEntry:
    """One engine rank's own cache directories: at tensor or pipeline parallelism above 1
    every worker compiles its own shard of the model into directories of its own."""

    rank: int
    # Bundle-relative directories that hold this rank's files and no other rank's.
    dirs: tuple[str, ...]

    def holds(self, path: str) -> bool:
        return any(path.startswith(d.rstrip("/") + "/") for d in self.dirs)


class _Sized(Protocol):
    @property
    def kind(self) -> CacheKind: ...
    @property
    def size(self) -> int: ...


def kind_totals(files: Iterable[_Sized]) -> dict[str, dict[str, int]]:
    """Files and bytes per cache kind (a bundle's, or a delta's)."""
    out: dict[str, dict[str, int]] = {}
    for f in files:
        t = out.setdefault(f.kind.value, {"files": 0, "bytes": 0})
        t["files"] += 1
        t["bytes"] += f.size
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Manifest:
    key: CacheKey
    files: tuple[FileEntry, ...]
    # Values of the engine's hashed env vars during compilation (absent = unset).
    hashed_env: tuple[tuple[str, str], ...] = ()
    # Free-form facts from the compile step (timings, peak memory, hit evidence).
    compile_report: tuple[tuple[str, Any], ...] = ()
    # Per-rank directories, sorted by rank; empty for an engine without ranks (torch) and
    # for bundles written before ranks were recorded.
    ranks: tuple[RankEntry, ...] = ()
    # Bundle-relative paths of logs the engine appends to (not hashed: nothing loads them).
    # Every other file in the cache root that is not listed in ``files`` is a stranger.
    logs: tuple[str, ...] = ()

    def rank_totals(self) -> dict[int, dict[str, int]]:
        """Files and bytes under each rank's directories, derived from ``files`` so the two
        cannot disagree."""
        out: dict[int, dict[str, int]] = {}
        for r in self.ranks:
            t = out.setdefault(r.rank, {"files": 0, "bytes": 0})
            for f in self.files:
                if r.holds(f.path):
                    t["files"] += 1
                    t["bytes"] += f.size
        return out

    def totals(self) -> dict[str, dict[str, int]]:
        return kind_totals(self.files)

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
        if self.logs:
            doc["logs"] = list(self.logs)
        if self.ranks:
            # Written only when there are ranks, so bundles without them keep their bytes.
            totals = self.rank_totals()
            doc["ranks"] = [{"rank": r.rank, "dirs": list(r.dirs), **totals[r.rank]} for r in self.ranks]
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = MANIFEST) -> Manifest:
        try:
            doc = jsondoc.loads(text)
            if doc.get("schema") != SCHEMA:
                raise BadInput(f"{source}: manifest schema {doc.get('schema')!r} is not {SCHEMA}")
            files = tuple(_entry(f, source) for f in doc["files"])
            return cls(
                key=parse_key(doc["key"]),
                files=files,
                hashed_env=tuple(sorted((str(k), str(v)) for k, v in doc.get("hashed_env", {}).items())),
                compile_report=tuple(sorted(doc.get("compile_report", {}).items())),
                ranks=_ranks(doc.get("ranks", []), source),
                logs=_logs(doc.get("logs", []), source),
            )
        except BadInput:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadInput(f"{source}: not a valid cache manifest ({type(exc).__name__}: {exc})") from None


def _entry(raw: Any, source: str) -> FileEntry:
    entry = FileEntry(str(raw["path"]), int(raw["size"]), str(raw["sha256"]), CacheKind(raw["kind"]))
    if problem := bundle_path_problem(entry.path, entry.kind):
        raise BadInput(f"{source}: manifest file {entry.path!r} {problem}")
    if entry.size < 0 or not SHA256_HEX.fullmatch(entry.sha256):
        raise BadInput(f"{source}: manifest file {entry.path!r}: size or sha256 is not valid")
    return entry


def _logs(raw: Any, source: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise BadInput(f"{source}: manifest logs must be a list of paths")
    for path in raw:
        if problem := bundle_path_problem(path):
            raise BadInput(f"{source}: manifest log {path!r} {problem}")
    return tuple(raw)


def _ranks(raw: Any, source: str) -> tuple[RankEntry, ...]:
    """Rank entries from JSON; their file counts are derived, so only rank and dirs are read."""
    if not isinstance(raw, list):
        raise BadInput(f"{source}: manifest ranks must be a list, got {type(raw).__name__}")
    entries = []
    for item in raw:
        rank, dirs = item["rank"], item["dirs"]
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise BadInput(f"{source}: manifest rank {rank!r} is not a non-negative integer")
        if not isinstance(dirs, list) or not all(isinstance(d, str) and d for d in dirs):
            raise BadInput(f"{source}: manifest rank {rank}: dirs must be a list of paths")
        entries.append(RankEntry(rank, tuple(dirs)))
    if len({e.rank for e in entries}) != len(entries):
        raise BadInput(f"{source}: manifest lists a rank twice")
    return tuple(sorted(entries, key=lambda e: e.rank))
