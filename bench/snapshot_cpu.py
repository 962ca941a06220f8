"""Baked start vs snapshot restore on the CPU default image (issue 40 item 4).

    python3 bench/snapshot_cpu.py --image IMAGE --criu PREFIX [--src src] --out bench/results/snapshot_cpu.json

1. baked: ``docker run IMAGE`` (kernelbake serve), seconds from ``docker run`` to ``/health`` 200,
   then one completion (temperature 0);
2. take: ``kernelbake snapshot take`` in a container with the snapshot's capabilities and no
   other (``--cap-drop ALL``, SYS_ADMIN, NET_ADMIN, SYS_TIME, SYS_CHROOT, SETGID; seccomp
   unconfined),
   its timings and size;
3. restored: the same image started with the snapshot mounted at /opt/kernelbake/snapshot and
   the pins admission would set; seconds to ``/health``, the same completion, compared;
4. mismatch: the same, with one more engine variable (the key's serve env differs): the seconds
   until serve says ``snapshot not used`` and starts baked (the container is then stopped).

Exits 1 unless the restore happened, gave the baked engine's completion, and the mismatch fell back.

``PREFIX`` is a CRIU prefix from images/base/criu/install.sh, mounted at /opt/kernelbake/criu
(an image built with SNAPSHOT=1 has it already). ``--src``: a checkout's src ahead of the image's
own kernelbake (PYTHONPATH), for a runtime newer than the image; the JSON says which ran. The
image digest is the local image id when the image was not pulled by digest. Stdlib only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

# contract.snapshot.SNAPSHOT_CAPABILITIES, after --cap-drop ALL (tests check they agree).
CAPS = ("SYS_ADMIN", "NET_ADMIN", "SYS_TIME", "SYS_CHROOT", "SETGID")
PROMPT = "Hello, my name is"


def _docker(*args: str, check: bool = True) -> str:
    print("+ docker " + " ".join(args), file=sys.stderr, flush=True)
    p = subprocess.run(["docker", *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise SystemExit(f"docker {args[0]} failed: {p.stderr[-2000:]}")
    return p.stdout


def _status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def _json(url: str, body: object | None = None) -> dict[str, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def _completion(port: int) -> str:
    base = f"http://127.0.0.1:{port}"
    model = _json(f"{base}/v1/models")["data"][0]["id"]  # type: ignore[index]
    doc = _json(
        f"{base}/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0}
    )
    return str(doc["choices"][0]["text"])  # type: ignore[index]


def _common(args: argparse.Namespace, work: Path) -> list[str]:
    out = [
        "--shm-size",
        "1g",
        "-v",
        f"{args.criu}:/opt/kernelbake/criu:ro",
        "-v",
        f"{work}:/work",
        "-e",
        "TMPDIR=/work/scratch",
    ]
    if args.src:
        out += ["-v", f"{Path(args.src).resolve()}:/src:ro", "-e", "PYTHONPATH=/src"]
    return out


def _caps() -> list[str]:
    return ["--cap-drop=ALL", *(f"--cap-add={c}" for c in CAPS), "--security-opt", "seccomp=unconfined"]


def _until_health(name: str, port: int, timeout: float, started: float) -> float:
    while time.monotonic() - started < timeout:
        if _status(f"http://127.0.0.1:{port}/health") == 200:
            return time.monotonic() - started
        if not _docker("ps", "-q", "-f", f"name={name}", check=False).strip():
            raise SystemExit(f"{name} exited before /health: {_docker('logs', name, check=False)[-2000:]}")
        time.sleep(0.05)
    raise SystemExit(f"{name}: no /health within {timeout:.0f} s")


def _log_lines(
    name: str, keep: Callable[[str], bool], until: Callable[[str], bool], wait_s: float, every: float
) -> list[str]:
    """The lines ``keep`` takes of container ``name``'s log, read every ``every`` seconds until
    one of them is ``until``'s, for ``wait_s`` at most (then as they are)."""
    t = time.monotonic()
    while True:
        got = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
        lines = [x for x in (got.stdout + got.stderr).splitlines() if keep(x)]
        if any(until(x) for x in lines) or time.monotonic() - t > wait_s:
            return lines
        time.sleep(every)


def _said_about_snapshot(name: str, wait_s: float = 60.0) -> list[str]:
    """serve's lines about the snapshot in container ``name``'s log. The restored engine answers
    /health before serve's own poll of it says `restored snapshot` (CI, 2 loaded cores: the
    completion was back and the log held no such line yet), so the log is read until one is
    there, for ``wait_s`` at most."""
    return _log_lines(
        name,
        keep=lambda x: x.startswith("kernelbake serve:") and "snapshot" in x,
        until=lambda x: "restored snapshot" in x or "snapshot not used" in x,
        wait_s=wait_s,
        every=0.2,
    )


def _serve(args: argparse.Namespace, work: Path, extra: list[str], tag: str) -> tuple[str, int, float]:
    """A detached serve container; (name, host port, seconds from docker run to /health)."""
    name = f"kb-snapshot-bench-{tag}-{uuid.uuid4().hex[:6]}"
    port = 18500 + (os.getpid() + len(tag)) % 400
    started = time.monotonic()
    _docker(
        "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", *_common(args, work), *extra, args.image
    )
    return name, port, _until_health(name, port, args.timeout, started)


def image_options(doc: str | None, timeout: float) -> argparse.ArgumentParser:
    """The options both snapshot benches take (this one's and snapshot_caps.py's)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", required=True)
    p.add_argument("--criu", required=True, type=Path, help="a CRIU prefix (images/base/criu/install.sh)")
    p.add_argument("--src", help="a checkout's src, ahead of the image's kernelbake")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=timeout)
    return p


def image_digest(image: str) -> str:
    """The image's registry digest, or its local id when it was not pulled by digest."""
    repo_digests = json.loads(_docker("image", "inspect", "--format", "{{json .RepoDigests}}", image))
    if repo_digests:
        return str(repo_digests[0].partition("@")[2])
    return _docker("image", "inspect", "--format", "{{.Id}}", image).strip()


def main() -> int:
    args = image_options(__doc__, 900.0).parse_args()
    digest = image_digest(args.image)
    result: dict[str, object] = {
        "image": args.image,
        "image_digest": digest,
        "kernelbake": "checkout src (PYTHONPATH)" if args.src else "the image's own",
        "host": {"cpus": os.cpu_count(), "kernel": os.uname().release},
    }
    with tempfile.TemporaryDirectory(prefix="kb-snapshot-bench-") as tmp:
        work = Path(tmp)
        name, port, baked_s = _serve(args, work, [], "baked")
        baked_text = _completion(port)
        _docker("rm", "-f", name)
        result["baked"] = {"ready_s": round(baked_s, 2), "completion": baked_text}

        t = time.monotonic()
        taken = _docker(
            "run", "--rm", *_caps(), *_common(args, work), "--entrypoint", "python3", args.image,
            "-m", "kernelbake", "snapshot", "take", "--out", "/work/snap", "--image-digest", digest,
        )  # fmt: skip
        take_s = time.monotonic() - t
        manifest = json.loads((work / "snap/snapshot.json").read_text())
        data = (work / "snap/snapshot.json").read_bytes()
        pin = "sha256:" + hashlib.sha256(data).hexdigest()
        result["take"] = {
            "wall_s": round(take_s, 2),
            "taken": manifest["taken"],
            "files": len(manifest["files"]),
            "snapshot_bytes": manifest["bytes"],
            "processes": [c for _, c in manifest["tree"]],
            "said": [line for line in taken.splitlines() if line.startswith("kernelbake snapshot:")],
        }
        pins = [
            "-v", f"{work / 'snap'}:/opt/kernelbake/snapshot:ro",
            "-e", f"KERNELBAKE_SNAPSHOT_DIGEST={pin}", "-e", f"KERNELBAKE_IMAGE_DIGEST={digest}",
            "-e", "KERNELBAKE_SNAPSHOT_MARKS=/work/marks",
        ]  # fmt: skip
        name, port, restored_s = _serve(args, work, [*_caps(), *pins], "restored")
        restored_text = _completion(port)
        said = _said_about_snapshot(name)
        _docker("rm", "-f", name)
        result["restored"] = {
            "ready_s": round(restored_s, 2),
            "completion": restored_text,
            "same_completion_as_baked": restored_text == baked_text,
            "said": said[-3:],
            "marked": (work / "marks").is_dir() and any((work / "marks").iterdir()),
        }

        name = f"kb-snapshot-bench-mismatch-{uuid.uuid4().hex[:6]}"
        t = time.monotonic()
        _docker(
            "run",
            "-d",
            "--name",
            name,
            *_common(args, work),
            *_caps(),
            *pins,
            "-e",
            "VLLM_LOGGING_LEVEL=INFO",
            args.image,
        )
        said = _log_lines(
            name, keep=lambda x: "snapshot not used" in x, until=lambda x: True, wait_s=120, every=0.05
        )
        line = said[0] if said else ""
        result["mismatch"] = {"said_after_s": round(time.monotonic() - t, 2), "said": line}
        _docker("rm", "-f", name)
    result["summary"] = {
        "ready_baked_s": result["baked"]["ready_s"],  # type: ignore[index]
        "ready_restored_s": result["restored"]["ready_s"],  # type: ignore[index]
        "snapshot_bytes": result["take"]["snapshot_bytes"],  # type: ignore[index]
        "same_completion": result["restored"]["same_completion_as_baked"],  # type: ignore[index]
        "mismatch_fallback_said_after_s": result["mismatch"]["said_after_s"],  # type: ignore[index]
    }
    text = json.dumps(result, indent=1, sort_keys=True)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    restored = result["restored"]
    held = (
        any(str(x).startswith("kernelbake serve: restored snapshot") for x in restored["said"])  # type: ignore[index]
        and restored["same_completion_as_baked"]  # type: ignore[index]
        and "snapshot not used: serve env" in str(result["mismatch"]["said"])  # type: ignore[index]
    )
    # Exit 1 unless the restore happened, answered as the baked engine did, and the mismatch fell back.
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
