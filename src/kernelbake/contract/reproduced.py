"""How a rebuild's files match what a replica claimed: what ``capture rebuild`` keeps, names and
drops, and how deterministic each kind is (same engine keys? same paths? same bytes?).

Pure, beside the record and the delta it compares: the host's rebuild (``signing.rebuild``,
which runs the image in Docker) and the GPU bench that plays the image with directories
(``bench/vllm_capture.py``) judge a rebuild the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from kernelbake.contract.delta import DeltaFile, DeltaManifest, Origin, Rebuild, engine_key
from kernelbake.contract.record import CaptureRecord


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reproduced:
    reproduced: tuple[str, ...]  # claimed, and rebuilt with the same bytes
    differed: tuple[str, ...]  # claimed, rebuilt with other bytes (the rebuild's are the delta's)
    dropped: tuple[str, ...]  # claimed, not rebuilt: not in the delta
    extra: tuple[str, ...]  # rebuilt, not claimed (in the delta: the trusted build made them)
    per_kind: dict[str, dict[str, Any]]


def per_kind(claims: Sequence[DeltaFile], rebuilt: Sequence[DeltaFile]) -> dict[str, dict[str, Any]]:
    """Per kind, how the rebuild's files and engine keys match the replica's claims."""
    out: dict[str, dict[str, Any]] = {}
    for kind in sorted({f.kind for f in (*claims, *rebuilt)}, key=lambda k: k.value):
        mine = {f.path: f.sha256 for f in claims if f.kind is kind}
        built = {f.path: f.sha256 for f in rebuilt if f.kind is kind}
        keys_claimed = {k for p in mine if (k := engine_key(kind, p))}
        keys_built = {k for p in built if (k := engine_key(kind, p))}
        both = mine.keys() & built.keys()
        out[kind.value] = {
            "claimed_files": len(mine),
            "rebuilt_files": len(built),
            "same_paths": len(both),
            "same_bytes": sum(mine[p] == built[p] for p in both),
            "claimed_engine_keys": sorted(keys_claimed),
            "rebuilt_engine_keys": sorted(keys_built),
            "same_engine_keys": keys_claimed == keys_built,
        }
    return out


def judge(record: CaptureRecord, rebuilt: Sequence[DeltaFile]) -> Reproduced:
    claimed = {f.path: f.sha256 for f in record.claims}
    built = {f.path: f.sha256 for f in rebuilt}
    both = claimed.keys() & built.keys()
    return Reproduced(
        reproduced=tuple(sorted(p for p in both if claimed[p] == built[p])),
        differed=tuple(sorted(p for p in both if claimed[p] != built[p])),
        dropped=tuple(sorted(claimed.keys() - built.keys())),
        extra=tuple(sorted(built.keys() - claimed.keys())),
        per_kind=per_kind(record.claims, rebuilt),
    )


def stamp(
    collected: DeltaManifest, record: CaptureRecord, *, builder: str, image: str, dropped: Sequence[str]
) -> DeltaManifest:
    """What a trusted build collected, as the rebuilt delta of ``record``: its files, the
    replica's name, and who rebuilt it from which image and record, with what it dropped."""
    return dataclasses.replace(
        collected,
        origin=Origin.REBUILT,
        replica=record.replica,
        rebuild=Rebuild(builder=builder, image=image, record=record.digest(), dropped=tuple(dropped)),
    )
