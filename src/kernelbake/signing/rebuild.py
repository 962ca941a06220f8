"""``kernelbake capture rebuild``: a replica's record compiled again by a trusted build, whose
output alone becomes the delta that is signed.

The build is the signed image itself, run by digest (``docker run IMAGE@sha256:…``) on a
builder of its GPU, with no network (``--network none``), its cache root the image's baked
caches and nothing else, and the model's weights faked (``--load-format dummy``: not in vLLM's
compile hash, so the same kernels compile). In it, ``capture replay`` sends each of the
record's request classes once to the image's own server, then ``capture collect`` takes what
the caches gained. The record's claims (the replica's paths and sha256s) are only compared with
that output: a file the replica claimed that the rebuild did not produce is dropped and named;
one it produced with other bytes is kept as rebuilt and named; the replica's bytes are never
read. The result is a delta directory of origin ``rebuilt`` for ``capture push``.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelbake.contract.delta import DELTA_MANIFEST, DeltaFile, DeltaManifest
from kernelbake.contract.record import CaptureRecord
from kernelbake.contract.reproduced import judge, stamp
from kernelbake.errors import BadInput, BuildFailed
from kernelbake.oci import parse_reference
from kernelbake.runner import Runner, run
from kernelbake.signing.delta import load_dir

# Where the record and the rebuild's output lie inside the rebuild's container.
_RECORD_IN = "/tmp/kernelbake-record.json"
_OUT_IN = "/tmp/kernelbake-rebuilt"
_SHOWN = 20


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rebuilt:
    out: Path | None  # None: the rebuild compiled nothing new, nothing written
    delta: DeltaManifest | None
    record: str  # sha256 of the record replayed
    reproduced: tuple[str, ...]  # claimed, and rebuilt with the same bytes
    differed: tuple[str, ...]  # claimed, rebuilt with other bytes (the rebuild's are in the delta)
    dropped: tuple[str, ...]  # claimed, not rebuilt: not in the delta
    extra: tuple[str, ...]  # rebuilt, not claimed (in the delta: the trusted build made them)
    per_kind: dict[str, dict[str, Any]]
    replay: tuple[str, ...]  # what the replay said

    def lines(self) -> list[str]:
        if self.out is None:
            head = f"the rebuild compiled nothing new for the record {self.record}; nothing to push"
        else:
            assert self.delta is not None
            head = (
                f"rebuilt {len(self.delta.files)} files into {self.out} from the record {self.record}: "
                f"{len(self.reproduced)} as the replica claimed, {len(self.differed)} with other bytes, "
                f"{len(self.extra)} the replica did not claim; {len(self.dropped)} claimed files dropped"
            )
        named = [f"dropped {p}: the rebuild did not produce it" for p in self.dropped]
        named += [
            f"rebuilt {p} with other bytes than the replica's (the rebuild's are kept)" for p in self.differed
        ]
        shown = named[:_SHOWN] + ([f"and {len(named) - _SHOWN} more"] if len(named) > _SHOWN else [])
        return [head, *shown]

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out) if self.out else None,
            "record": self.record,
            "files": len(self.delta.files) if self.delta else 0,
            "reproduced": list(self.reproduced),
            "differed": list(self.differed),
            "dropped": list(self.dropped),
            "extra": list(self.extra),
            "per_kind": self.per_kind,
            "replay": list(self.replay),
        }


def _docker(runner: Runner, argv: list[str], what: str, timeout: float | None = None) -> str:
    done = runner(["docker", *argv], capture=True, timeout=timeout)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise BuildFailed(f"rebuild: {what} failed (rc {done.returncode}): {tail}")
    return done.stdout


def _run_build(
    runner: Runner, image: str, record_file: Path, staging: Path, docker_args: Sequence[str], timeout: float
) -> tuple[bool, list[str]]:
    """The trusted build in one container; whether it compiled anything, and the replay's lines."""
    name = f"kb-rebuild-{secrets.token_hex(4)}"
    try:
        _docker(
            runner,
            [
                "run", "-d", "--name", name, "--network", "none", "--shm-size", "2g", *docker_args,
                "-v", f"{record_file}:{_RECORD_IN}:ro", image, "--load-format", "dummy",
            ],
            f"starting {image}",
        )  # fmt: skip
        said = _docker(
            runner,
            ["exec", name, "python3", "-m", "kernelbake", "capture", "replay", "--record", _RECORD_IN],
            "the replay",
            timeout,
        )
        _docker(
            runner,
            [
                "exec",
                name,
                "python3",
                "-m",
                "kernelbake",
                "capture",
                "collect",
                "--out",
                _OUT_IN,
                "--replica",
                name,
            ],
            "collecting the rebuild's files",
        )
        if runner(["docker", "exec", name, "test", "-e", f"{_OUT_IN}/{DELTA_MANIFEST}"]).returncode != 0:
            return False, said.splitlines()
        _docker(runner, ["cp", f"{name}:{_OUT_IN}", str(staging)], "copying the rebuild's files out")
        return True, said.splitlines()
    except BuildFailed as exc:
        # The server's own words on why, where the failure was its (the replay only sees it gone).
        logs = runner(["docker", "logs", "--tail", "40", name], capture=True)
        raise BuildFailed(f"{exc}\n{name}'s last lines:\n{(logs.stdout + logs.stderr)[-3000:]}") from None
    finally:
        runner(["docker", "rm", "-f", name], capture=True)


def rebuild(
    record_file: Path,
    *,
    image: str,
    out: Path,
    builder: str,
    docker_args: Sequence[str] = (),
    runner: Runner = run,
    timeout: float = 3600.0,
) -> Rebuilt:
    """Rebuild ``record_file`` in ``image`` (``REPO@sha256:…``, the image the replica ran) and
    write the rebuilt delta to ``out`` (new or empty)."""
    ref = parse_reference(image)
    if ref.digest is None:
        raise BadInput(
            f"{image}: the rebuild runs the signed image by digest (IMAGE@sha256:…), the one the replica ran"
        )
    if not builder:
        raise BadInput("--builder: name the builder that runs the rebuild; the attestation says who rebuilt")
    try:
        record = CaptureRecord.from_json(record_file.read_bytes(), source=str(record_file))
    except OSError as exc:
        raise BadInput(f"{record_file}: cannot read the capture record ({exc.strerror or exc})") from None
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(
            f"{out}: not an empty directory; the rebuild writes a delta only into a new or empty one"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.rebuilding-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        built, said = _run_build(runner, ref.pinned(), record_file.resolve(), staging, docker_args, timeout)
        if not built:
            return _judge(record, (), said)
        collected, _entries = load_dir(staging)  # every file checked against its delta.json
        if (collected.key, collected.base_manifest) != (record.key, record.base_manifest):
            raise BadInput(
                f"{record_file}: recorded over the bundle {record.base_manifest} (key {record.key.digest}); "
                f"{image} holds {collected.base_manifest} (key {collected.key.digest}): rebuild on the image "
                "the replica ran"
            )
        result = _judge(record, collected.files, said)
        delta = stamp(collected, record, builder=builder, image=str(ref.digest), dropped=result.dropped)
        (staging / DELTA_MANIFEST).write_text(delta.to_json())
        if out.exists():
            out.rmdir()
        staging.rename(out)
        return dataclasses.replace(result, out=out, delta=delta)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _judge(record: CaptureRecord, files: tuple[DeltaFile, ...], said: list[str]) -> Rebuilt:
    found = judge(record, files)
    return Rebuilt(
        out=None,
        delta=DeltaManifest(key=record.key, base_image=None, base_manifest=record.base_manifest, files=files)
        if files
        else None,
        record=record.digest(),
        reproduced=found.reproduced,
        differed=found.differed,
        dropped=found.dropped,
        extra=found.extra,
        per_kind=found.per_kind,
        replay=tuple(said),
    )
