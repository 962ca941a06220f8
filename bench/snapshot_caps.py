"""The capabilities a snapshot needs, measured one by one from none (``--cap-drop ALL``) on the
CPU default image: the set ``contract.snapshot.SNAPSHOT_CAPABILITIES`` names, which the pod
recipe adds after ``drop: [ALL]`` and ``make snapshot`` takes with.

    python3 bench/snapshot_caps.py --image IMAGE --criu PREFIX --out bench/results/snapshot_caps.json
    python3 bench/snapshot_caps.py … --restore-with podman --ulimit nofile=16384:16384 \
        --out bench/results/snapshot_caps_podman.json     (IMAGE pulled into podman too)

1. take: ``kernelbake snapshot take`` with the whole set, then without each capability in turn;
2. restore, after each take: the whole set's snapshot started by serve with the whole set (and
   a completion asked of the restored engine), then without each capability in turn, each time
   the snapshot taken without it where that take worked (its tree holds no capability the container lacks,
   so serve's gate lets CRIU try): serve's line says ``restored snapshot`` or ``snapshot not
   used: …`` (a refused or failed restore then starts the baked way, not waited for).

Take runs in Docker; the restores in Docker or podman (``--restore-with``): what a restore
needs depends on the runtime that restores (CRIU gives root back the supplementary groups it
had, which needs SETGID where the runtime gave it other ones). A capability is needed by a step
when the step fails without it. Exits 1 unless the whole set takes and restores; the summary
says which capabilities of the set this runtime did not need (tests check that each is needed
under one of the runtimes measured). Docker's seccomp profile is unconfined throughout (CRIU needs
PTRACE_O_SUSPEND_SECCOMP, which the profile refuses). Stdlib only, and snapshot_cpu's helpers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot_cpu import CAPS, _common, _completion, _docker, _status, image_digest, image_options

SAID = ("kernelbake serve: restored snapshot", "kernelbake serve: snapshot not used")


def _flags(args: argparse.Namespace, caps: Sequence[str]) -> list[str]:
    limits = [x for u in args.ulimit for x in ("--ulimit", u)]
    return [
        "--cap-drop=ALL",
        *(f"--cap-add={c}" for c in caps),
        "--security-opt",
        "seccomp=unconfined",
        *limits,
    ]


def _take(
    args: argparse.Namespace, work: Path, caps: Sequence[str], out: str, digest: str
) -> dict[str, object]:
    cmd = [
        "docker", "run", "--rm", *_flags(args, caps), *_common(args, work), "--entrypoint", "python3", args.image,
        "-m", "kernelbake", "snapshot", "take", "--out", f"/work/{out}", "--image-digest", digest,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    said = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.startswith("kernelbake snapshot")]
    return {"ok": done.returncode == 0, "said": said[-1][:400] if said else (done.stderr[-400:] or "")}


def _restore(
    args: argparse.Namespace, work: Path, caps: Sequence[str], pins: list[str], serve: bool
) -> dict[str, object]:
    """serve with the snapshot and ``caps``, under ``--restore-with``: its line on the restore
    (and, restored and ``serve``, seconds to /health and the restored engine's completion)."""
    rt = args.restore_with
    name = f"kb-snapshot-caps-{uuid.uuid4().hex[:6]}"
    port = 18900 + os.getpid() % 90
    started = time.monotonic()
    run = [rt, "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", *_common(args, work)]
    subprocess.run([*run, *_flags(args, caps), *pins, args.image], check=True, capture_output=True)
    try:
        line = ""
        while not line and time.monotonic() - started < args.timeout:
            got = subprocess.run([rt, "logs", name], capture_output=True, text=True)
            line = next((ln for ln in (got.stdout + got.stderr).splitlines() if ln.startswith(SAID)), "")
            time.sleep(0.1)
        out: dict[str, object] = {"ok": line.startswith(SAID[0]), "said": line[:400]}
        if out["ok"] and serve:
            while (
                _status(f"http://127.0.0.1:{port}/health") != 200
                and time.monotonic() - started < args.timeout
            ):
                time.sleep(0.05)
            out["ready_s"] = round(time.monotonic() - started, 2)
            out["completion"] = _completion(port)
        return out
    finally:
        subprocess.run([rt, "rm", "-f", name], capture_output=True)


def _pins(snap: Path, digest: str) -> list[str]:
    """The snapshot mounted where serve restores from, and the two pins admission would set."""
    data = (snap / "snapshot.json").read_bytes()
    return [
        "-v", f"{snap}:/opt/kernelbake/snapshot:ro",
        "-e", "KERNELBAKE_SNAPSHOT_DIGEST=sha256:" + hashlib.sha256(data).hexdigest(),
        "-e", f"KERNELBAKE_IMAGE_DIGEST={digest}",
    ]  # fmt: skip


def needed(steps: Mapping[str, Mapping[str, Mapping[str, object]]], whole: str) -> dict[str, list[str]]:
    """Per step, the capabilities without which it failed: ``steps[step][run]`` is a run's
    outcome, ``run`` the whole set's name or ``without <CAP>``."""
    return {
        step: sorted(
            run.removeprefix("without ") for run, got in runs.items() if run != whole and not got["ok"]
        )
        for step, runs in steps.items()
    }


def main() -> int:
    p = image_options(__doc__, 600.0)
    p.add_argument("--restore-with", choices=("docker", "podman"), default="docker")
    p.add_argument(
        "--ulimit", action="append", default=[], help="docker/podman --ulimit, for take and restore"
    )
    args = p.parse_args()
    digest = image_digest(args.image)
    whole = "all of " + ", ".join(CAPS)
    runs = {whole: list(CAPS), **{f"without {c}": [x for x in CAPS if x != c] for c in CAPS}}
    steps: dict[str, dict[str, dict[str, object]]] = {"take": {}, "restore": {}}
    with tempfile.TemporaryDirectory(prefix="kb-snapshot-caps-") as tmp:
        work = Path(tmp)
        for i, (run, caps) in enumerate(runs.items()):
            steps["take"][run] = _take(args, work, caps, f"snap-{i}", digest)
            print(f"take, {run}: {steps['take'][run]}", file=sys.stderr, flush=True)
            if not steps["take"][whole]["ok"]:
                raise SystemExit(f"take with {whole} failed: {steps['take'][whole]['said']}")
            # The snapshot taken without the same capability where that take worked: its tree
            # holds none the container lacks, so the gate lets CRIU try and CRIU's own need shows.
            snap = work / f"snap-{i if steps['take'][run]['ok'] else 0}"
            steps["restore"][run] = _restore(args, work, caps, _pins(snap, digest), serve=run == whole)
            print(f"restore, {run}: {steps['restore'][run]}", file=sys.stderr, flush=True)
            if i:  # 2.2 GB each: only the whole set's is kept
                shutil.rmtree(work / f"snap-{i}", ignore_errors=True)
        recorded = json.loads((work / "snap-0/snapshot.json").read_bytes()).get("capabilities")
    need = needed(steps, whole)
    minimal = sorted(set(need["take"]) | set(need["restore"]))
    result = {
        "image": args.image,
        "image_digest": digest,
        "host": {"cpus": os.cpu_count(), "kernel": os.uname().release},
        "docker": _docker("version", "--format", "{{.Server.Version}}").strip(),
        "restore_with": args.restore_with,
        "restore_runtime": subprocess.run(
            [args.restore_with, "--version"], capture_output=True, text=True
        ).stdout.strip(),
        "ulimits": args.ulimit,
        "set": list(CAPS),
        "recorded_by_take": recorded,
        "steps": steps,
        "summary": {
            "needed_by_take": need["take"],
            "needed_by_restore": need["restore"],
            "needed": minimal,
            "not_needed_here": sorted(set(CAPS) - set(minimal)),
            "restored_with_the_set": bool(steps["restore"][whole]["ok"]),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0 if result["summary"]["restored_with_the_set"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
