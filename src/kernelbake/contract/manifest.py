"""The cache manifest: every file of the bundle (path, size, sha256) and per-kind totals, with
the key the caches were built for.

Written by ``kernelbake compile`` as the image's last layer; read by the preflight, by
``inspect``, and by signing, whose attestation carries its digest so that a verifier can tie
the bytes in the image to a signature.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kernelbake.contract.key import CacheKey, parse_key
from kernelbake.contract.layout import MANIFEST, CacheKind
from kernelbake.errors import BadInput

# A hashed variable that was not set at compile time (so setting it later is a change).
UNSET = "<unset>"
SCHEMA = 1


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
