"""Capture on the CPU default image (issues 36 and 42): a replica serves a request class the
build's warm-up does not cover and compiles for it; a line is then appended to a Python module
Inductor compiled for it (the poisoned replica). ``kernelbake capture record`` records the
request classes ``serve`` noted as the engine compiled for them (no ``--request``: the bench sends
the class, the replica says what it was) and what the caches gained (claims, no bytes);
``capture rebuild`` runs the image by digest with no network and fake weights, replays the noted
batches and takes only what that trusted build compiled;
``capture push`` pushes that, layered on the image (default tag: one per base digest), signed
with a fresh key and attested as rebuilt; ``capture verify`` checks it as admission does; a new
replica starts with the delta mounted at /opt/kernelbake/delta and ``$KERNELBAKE_DELTA_DIGEST``
set to the verified digest, and serves the same class without compiling. The poisoned bytes:
never in the rebuilt delta; the replica's own delta (``capture collect``) is refused at push
without ``--unsafe-replica-bytes`` and, pushed with it, by ``capture verify`` under the default
policy. Determinism on this image: the rebuild's files against the replica's (before the
poison), per kind: same engine keys, same paths, same bytes.

    python3 bench/capture_cpu.py --image "$(cat build/image.ref)" --out bench/results/capture_cpu.json

``--image`` is a pushed tiny-llama vLLM CPU image (``make image``), by digest; the replicas run
the kernelbake the image was built with. ``--src`` (optional): a checkout's ``src``, bind-mounted
read-only into both replicas ahead of the image's own kernelbake (``PYTHONPATH``), to try a
runtime on an image built before it; the JSON says which ran. The delta reaches the second replica as the registry serves it: pulled by digest
(``docker pull``), its root exported (``docker create`` + ``docker export``) and bind-mounted
read-only, where a Kubernetes image volume would mount it. Stdlib only, besides docker and the
kernelbake CLI (``--kernelbake``). Elsewhere (a GPU image): ``--docker-arg=--gpus=all``, ``--model``
and ``--request '{...}'`` (the class the first replica is sent: one that compiles there; the
default is the CPU image's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# The class: logprobs of 20 tokens with top-k 3 sampling. The warm-up's logprob classes ask
# for at most 5 (runtime/engines/vllm/warmup.py); on vLLM 0.32.0's CPU build this request makes
# Inductor compile a graph of its own (seen: 5 new files under inductor/).
CLASS = {"max_tokens": 8, "logprobs": 20, "temperature": 0.7, "top_k": 3, "prompt": "hello"}
# A loaded 2-core host took over 600 s to start a replica (load average 20).
READY_TIMEOUT = 1500.0
# Appended to a module Inductor compiled: it would run on the next replica's first hit.
POISON = '\nopen("/tmp/kernelbake-poisoned", "w").write("ran")\n'


def sh(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(argv), file=sys.stderr, flush=True)
    return subprocess.run(argv, text=True, capture_output=True, check=False, **kw)


def must(argv: list[str], **kw: Any) -> str:
    done = sh(argv, **kw)
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)}: rc {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def ready(port: int, name: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < READY_TIMEOUT:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - started
        except (urllib.error.URLError, OSError):
            pass
        if sh(["docker", "inspect", "-f", "{{.State.Running}}", name]).stdout.strip() != "true":
            raise SystemExit(f"{name} stopped:\n{sh(['docker', 'logs', name]).stderr[-4000:]}")
        time.sleep(1)
    raise SystemExit(f"{name}: not ready within {READY_TIMEOUT} s")


def ask(port: int, model: str, request: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps({"model": model, **request}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=300) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return {
        "seconds": round(time.monotonic() - started, 3),
        "finish_reason": doc["choices"][0]["finish_reason"],
    }


def gained(name: str) -> list[str]:
    """Cache files newer than the image's pinned manifest (Inductor's lock files aside)."""
    out = must(
        [
            "docker", "exec", name, "find", "/opt/kernelbake/cache", "-type", "f",
            "-newer", "/opt/kernelbake/pinned-manifest.json", "!", "-name", "*.lock",
        ]
    )  # fmt: skip
    return sorted(line.removeprefix("/opt/kernelbake/cache/") for line in out.splitlines() if line)


def serve_lines(name: str) -> list[str]:
    logs = sh(["docker", "logs", name])
    return [line for line in (logs.stdout + logs.stderr).splitlines() if line.startswith("kernelbake serve:")]


def overlay(src: Path | None) -> list[str]:
    """``docker run`` arguments that put ``src`` ahead of the image's own kernelbake (none: the
    image's)."""
    return [] if src is None else ["-v", f"{src}:/kbsrc:ro", "-e", "PYTHONPATH=/kbsrc"]


def overlay_flags(src: Path | None) -> list[str]:
    """``overlay`` as single-word flags, for ``capture rebuild --docker-arg``."""
    return [] if src is None else [f"--volume={src}:/kbsrc:ro", "--env=PYTHONPATH=/kbsrc"]


def replica(image: str, src: Path | None, name: str, port: int, extra: list[str]) -> dict[str, Any]:
    sh(["docker", "rm", "-f", name])
    started = time.monotonic()
    must(
        [
            "docker", "run", "-d", "--name", name, "--shm-size", "2g", "-p", f"127.0.0.1:{port}:8000",
            *overlay(src), *extra, image,
        ]
    )  # fmt: skip
    seconds = ready(port, name)
    return {
        "name": name,
        "ready_s": round(seconds, 1),
        "run_to_ready_s": round(time.monotonic() - started, 1),
    }


def _delta_of(doc: Any) -> Any:
    """The ``delta`` object anywhere in ``kernelbake check --json``'s answer."""
    if isinstance(doc, dict):
        if isinstance(doc.get("delta"), dict):
            return doc["delta"]
        for value in doc.values():
            if (found := _delta_of(value)) is not None:
                return found
    return None


def _check(image: str, src: Path | None, mounted: Path, digest: str, extra: list[str]) -> dict[str, Any]:
    """``kernelbake check --json`` in a fresh container of ``image`` with ``mounted`` as its delta."""
    done = sh(
        [
            "docker", "run", "--rm", "--shm-size", "2g", *extra, *overlay(src),
            "-v", f"{mounted}:/opt/kernelbake/delta:ro", "-e", f"KERNELBAKE_DELTA_DIGEST={digest}",
            image, "check", "--json",
        ]
    )  # fmt: skip
    try:
        delta = _delta_of(json.loads(done.stdout[done.stdout.index("{") :]))
    except ValueError:
        delta = None
    return {"rc": done.returncode, "delta": delta}


def _repin(root: Path) -> str:
    return "sha256:" + hashlib.sha256((root / "delta.json").read_bytes()).hexdigest()


def refusals(
    image: str, src: Path | None, mounted: Path, work: Path, digest: str, extra: list[str]
) -> dict[str, Any]:
    """Item 4 on the real image: each bad delta is refused by serve's preflight, by name."""
    out: dict[str, Any] = {}
    baked = json.loads(
        must(["docker", "run", "--rm", "--entrypoint", "cat", image, "/opt/kernelbake/pinned-manifest.json"])
    )
    cases = ("tampered_file", "unpinned_digest", "base_mismatch", "overwrites_baked_file")
    for case in cases:
        root = work / f"bad-{case}"
        shutil.copytree(mounted, root)
        pin = digest
        doc = json.loads((root / "delta.json").read_text())
        if case == "tampered_file":
            # The first file of the first kind (Inductor on the CPU image; whatever a GPU compiled).
            victim = root / next(iter(sorted(doc["kinds"].items())))[1]["files"][0]["path"]
            data = bytearray(victim.read_bytes())
            data[0] ^= 1
            victim.write_bytes(bytes(data))
        elif case == "unpinned_digest":
            pin = "sha256:" + "0" * 64
        elif case == "base_mismatch":
            doc["base"]["manifest"] = "sha256:" + "1" * 64
            (root / "delta.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            pin = _repin(root)
        else:
            target = baked["files"][0]
            (root / target["path"]).parent.mkdir(parents=True, exist_ok=True)
            (root / target["path"]).write_bytes(b"other bytes")
            entry = {"path": target["path"], "size": 11, "sha256": hashlib.sha256(b"other bytes").hexdigest()}
            doc["kinds"].setdefault(target["kind"], {"files": []})["files"].append(entry)
            (root / "delta.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            pin = _repin(root)
        out[case] = _check(image, src, root, pin, extra)
    return out


def sha256s(name: str, paths: list[str]) -> dict[str, str]:
    """The sha256 of each cache file in the container, as it is now."""
    if not paths:
        return {}
    out = must(["docker", "exec", "-w", "/opt/kernelbake/cache", name, "sha256sum", "--", *paths])
    return {line.split(None, 1)[1].strip(): line.split(None, 1)[0] for line in out.splitlines() if line}


def poison(name: str, gained: list[str]) -> str:
    """Append a line to a Python module Inductor compiled for the class (what a sidecar on the
    volume, or a bug in serving code, could do); returns its path."""
    victim = next((p for p in gained if p.endswith(".py")), gained[0])
    must(["docker", "exec", "-i", name, "sh", "-c", f"cat >> /opt/kernelbake/cache/{victim}"], input=POISON)
    return victim


def determinism(clean: dict[str, str], rebuilt: dict[str, Any]) -> dict[str, Any]:
    """Per kind: the rebuild's files against the replica's as it compiled them (lock files,
    which the replica's listing leaves out, aside)."""
    built = {f["path"]: f["sha256"] for k in rebuilt["kinds"].values() for f in k["files"]}
    out: dict[str, Any] = {}
    for kind in sorted({p.split("/")[0] for p in (*clean, *built)}):
        mine = {p: h for p, h in clean.items() if p.startswith(kind + "/")}
        theirs = {p: h for p, h in built.items() if p.startswith(kind + "/") and not p.endswith(".lock")}
        both = mine.keys() & theirs.keys()
        out[kind] = {
            "replica_files": len(mine),
            "rebuilt_files": len(theirs),
            "same_paths": len(both),
            "same_bytes": sum(mine[p] == theirs[p] for p in both),
            "other_bytes": sorted(p for p in both if mine[p] != theirs[p]),
            "only_replica": sorted(mine.keys() - theirs.keys()),
            "only_rebuild": sorted(theirs.keys() - mine.keys()),
        }
    return out


def replica_signed(
    kb: list[str], env: dict[str, str], delta: Path, base: str, to: str, policy: Path, key: Path
) -> dict[str, Any]:
    """The poisoned replica's own bytes: refused at push without the unsafe flag; pushed with it,
    refused by ``capture verify`` under the default policy."""
    push = [*kb, "capture", "push", str(delta), "--base", base, "--to", to, "--key", str(key)]
    plain = sh(push, env=env)
    unsafe = sh([*push, "--unsafe-replica-bytes"], env=env)
    verify = sh([*kb, "capture", "verify", to, "--base", base, "--policy", str(policy)], env=env)
    return {
        "push_rc": plain.returncode,
        "push_message": (plain.stderr or plain.stdout).strip()[-600:],
        "unsafe_push_rc": unsafe.returncode,
        "unsafe_push": unsafe.stdout.strip()[-600:],
        "verify_rc": verify.returncode,
        "verify_message": (verify.stderr or verify.stdout).strip()[-600:],
    }


def foreign_key(kb: list[str], env: dict[str, str], delta: str, base: str, work: Path) -> dict[str, Any]:
    """``capture verify`` with a policy that trusts another key than the one that signed it."""
    must([*kb, "generate-key-pair", "--dir", str(work / "foreign"), "--name", "foreign"], env=env)
    policy = work / "foreign-policy.yaml"
    policy.write_text(f"keys: [{work / 'foreign' / 'foreign.pub'}]\n")
    done = sh([*kb, "capture", "verify", delta, "--base", base, "--policy", str(policy)], env=env)
    return {"rc": done.returncode, "message": (done.stderr or done.stdout).strip()[-600:]}


def main() -> int:
    global READY_TIMEOUT  # one run, one setting: ready() reads it
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", required=True, help="REPO@sha256:… of the pushed CPU image")
    p.add_argument(
        "--src",
        type=Path,
        help="a kernelbake src to bind-mount over the image's own (default: the image's, as built)",
    )
    p.add_argument("--kernelbake", default=f"{sys.executable} -m kernelbake")
    p.add_argument("--port", type=int, default=18041)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", default="/models/tiny-llama", help="the served model's name")
    p.add_argument("--request", type=json.loads, default=CLASS, help="the request class, as JSON")
    p.add_argument(
        "--docker-arg", action="append", default=[], help="passed to every docker run (e.g. --gpus=all)"
    )
    p.add_argument("--builder", default=f"bench-{os.uname().nodename}", help="the rebuild's builder name")
    p.add_argument(
        "--ready-timeout", type=float, default=READY_TIMEOUT, help="seconds a replica may take to /health"
    )
    a = p.parse_args()
    READY_TIMEOUT = a.ready_timeout
    kb = a.kernelbake.split()
    src = a.src.resolve() if a.src else None
    repo = a.image.partition("@")[0]
    model = a.model
    doc: dict[str, Any] = {
        "bench": "capture_cpu",
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
        "image": a.image,
        "runtime": (
            f"this checkout's {a.src} bind-mounted over the image's kernelbake (PYTHONPATH)"
            if src
            else "the image's own kernelbake, as built"
        ),
        "request_class": a.request,
    }
    # A fresh key without a password (none of the host's key variables).
    skip = ("KERNELBAKE_SIGNING_KEY_PASSWORD", "COSIGN_PASSWORD")
    env = {k: v for k, v in os.environ.items() if k not in skip}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    with tempfile.TemporaryDirectory(prefix="kb-capture-bench-") as tmp:
        work = Path(tmp)
        one = "kb-capture-bench-1"
        try:
            first = replica(a.image, src, one, a.port, a.docker_arg)
            first["serve"] = serve_lines(one)
            first["gained_before_request"] = gained(one)
            first["request"] = ask(a.port, model, a.request)
            first["gained_after_request"] = gained(one)
            clean = sha256s(one, first["gained_after_request"])
            first["poisoned"] = poison(one, first["gained_after_request"])
            # No --request: the classes are the ones serve noted as the engine compiled for them.
            recorded = must(
                ["docker", "exec", one, "python3", "-m", "kernelbake", "capture", "record",
                 "--out", "/tmp/record.json", "--replica", one]
            )  # fmt: skip
            first["record"] = recorded.strip().splitlines()
            must(["docker", "cp", f"{one}:/tmp/record.json", str(work / "record.json")])
            collected = must(
                ["docker", "exec", one, "python3", "-m", "kernelbake", "capture", "collect",
                 "--out", "/tmp/delta", "--replica", one]
            )  # fmt: skip
            first["collect"] = collected.strip().splitlines()
            must(["docker", "cp", f"{one}:/tmp/delta", str(work / "replica-delta")])
        finally:
            sh(["docker", "rm", "-f", one])
        doc["first_replica"] = first
        doc["record"] = json.loads((work / "record.json").read_text())
        noted = [w for w in doc["record"]["waves"] if w["source"] == "served"]
        doc["record_noted"] = {
            "served_waves": len(noted),
            "operator_waves": len(doc["record"]["waves"]) - len(noted),
            "classes": [doc["record"]["requests"][i] for w in noted for i, _n in w["requests"]],
            "compiled": [c for w in noted for c in w["compiled"]],
        }

        started = time.monotonic()
        said = must(
            [*kb, "capture", "rebuild", str(work / "record.json"), "--image", a.image,
             "--out", str(work / "delta"), "--builder", a.builder, "--json",
             *(f"--docker-arg={x}" for x in [*a.docker_arg, *overlay_flags(src)])], env=env,
        )  # fmt: skip
        rebuilt = json.loads(said[said.index("\n{") + 1 :])
        rebuilt["lines"] = said[: said.index("\n{")].splitlines()
        rebuilt["seconds"] = round(time.monotonic() - started, 1)
        doc["rebuild"] = rebuilt
        if rebuilt["out"] is None:
            a.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            raise SystemExit(f"the rebuild compiled nothing for the class: {rebuilt['lines']}")
        doc["delta_manifest"] = json.loads((work / "delta" / "delta.json").read_text())
        doc["determinism"] = determinism(clean, doc["delta_manifest"])
        victim = work / "delta" / first["poisoned"]
        claimed = {f["path"]: f["sha256"] for k in doc["record"]["claims"].values() for f in k["files"]}
        in_delta = {f["sha256"] for k in doc["delta_manifest"]["kinds"].values() for f in k["files"]}
        doc["poisoned_replica"] = {
            "path": first["poisoned"],
            "clean_sha256": clean.get(first["poisoned"]),
            "poisoned_sha256": claimed.get(first["poisoned"]),
            "poisoned_sha256_in_delta": claimed.get(first["poisoned"]) in in_delta,
            "rebuilt_sha256": hashlib.sha256(victim.read_bytes()).hexdigest() if victim.exists() else None,
            "named_as_other_bytes": first["poisoned"] in rebuilt["differed"],
        }

        keys = work / "keys"
        must([*kb, "generate-key-pair", "--dir", str(keys), "--name", "capture-bench"], env=env)
        pushed = json.loads(
            must(
                [*kb, "capture", "push", str(work / "delta"), "--base", a.image,
                 "--key", str(keys / "capture-bench.key"), "--replica", one, "--json"], env=env,
            ).split("\n", 1)[1]
        )  # fmt: skip
        doc["push"] = pushed
        to = pushed["tagged"]
        policy = work / "policy.yaml"
        policy.write_text(f"keys: [{keys / 'capture-bench.pub'}]\n")
        verified = json.loads(
            must(
                [*kb, "capture", "verify", to, "--base", a.image, "--policy", str(policy), "--json"], env=env
            ).split("\n", 1)[1]
        )
        doc["verification"] = verified

        # The delta as the registry serves it, where an image volume would mount it.
        delta_ref = pushed["reference"]
        must(["docker", "pull", delta_ref])
        holder = must(["docker", "create", delta_ref, "true"]).strip()
        try:
            exported = work / "delta.tar"
            with exported.open("wb") as fh:
                subprocess.run(["docker", "export", holder], stdout=fh, check=True)
        finally:
            sh(["docker", "rm", holder])
        mounted = work / "mounted"
        with tarfile.open(exported) as tar:
            members = [
                m
                for m in tar.getmembers()
                if m.name.split("/")[0] in ("delta.json", "inductor", "triton", "vllm")
            ]
            tar.extractall(mounted, members=members, filter="data")
        two = "kb-capture-bench-2"
        try:
            second = replica(
                a.image, src, two, a.port,
                [*a.docker_arg, "-v", f"{mounted}:/opt/kernelbake/delta:ro", "-e", f"KERNELBAKE_DELTA_DIGEST={verified['manifest_digest']}"],
            )  # fmt: skip
            second["serve"] = serve_lines(two)
            second["request"] = ask(a.port, model, a.request)
            second["gained_after_request"] = [
                f
                for f in gained(two)
                if f not in {x["path"] for k in doc["delta_manifest"]["kinds"].values() for x in k["files"]}
            ]
            status = sh(["docker", "exec", two, "cat", "/tmp/kernelbake-status.json"])
            if status.returncode == 0:
                second["status_delta"] = json.loads(status.stdout).get("preflight", {}).get("delta")
            second["poison_ran"] = (
                sh(["docker", "exec", two, "test", "-e", "/tmp/kernelbake-poisoned"]).returncode == 0
            )
        finally:
            sh(["docker", "rm", "-f", two])
        doc["next_replica"] = second
        doc["refused"] = refusals(a.image, src, mounted, work, verified["manifest_digest"], a.docker_arg)
        doc["refused"]["foreign_key"] = foreign_key(kb, env, to, a.image, work)
        doc["refused"]["replica_signed"] = replica_signed(
            kb, env, work / "replica-delta", a.image, f"{repo}:capture-bench-replica-delta", policy,
            keys / "capture-bench.key",
        )  # fmt: skip
        # The pulled delta is this run's local copy; the registry keeps what was pushed.
        sh(["docker", "rmi", delta_ref])
    merged = [line for line in second["serve"] if "cache delta" in line]
    poisoned = doc["poisoned_replica"]
    signed = doc["refused"]["replica_signed"]
    doc["summary"] = {
        "delta_files": sum(len(k["files"]) for k in doc["delta_manifest"]["kinds"].values()),
        "delta_origin": doc["delta_manifest"]["origin"],
        "rebuild_s": rebuilt["seconds"],
        "rebuild_dropped": len(rebuilt["dropped"]),
        "verified": bool(verified.get("verified")) and any("merged into the caches" in m for m in merged),
        "first_replica_compiled_for_the_class": len(first["gained_after_request"])
        - len(first["gained_before_request"]),
        "next_replica_start": merged[0] if merged else "no delta line",
        "next_replica_compiled_for_the_class": len(second["gained_after_request"]),
        "first_replica_request_s": first["request"]["seconds"],
        "next_replica_request_s": second["request"]["seconds"],
        "first_ready_s": first["ready_s"],
        "next_ready_s": second["ready_s"],
        "determinism": {
            kind: {
                "same_paths": f"{d['same_paths']}/{d['replica_files']}",
                "same_bytes": f"{d['same_bytes']}/{d['same_paths']}",
            }
            for kind, d in doc["determinism"].items()
        },
        "poisoned_bytes_in_rebuilt_delta": poisoned["poisoned_sha256_in_delta"] or second["poison_ran"],
        # The record's classes came from serve's notes, none from the operator.
        "record_served_waves": doc["record_noted"]["served_waves"],
        "record_operator_waves": doc["record_noted"]["operator_waves"],
    }
    doc["summary"]["refused"] = {
        case: bool(r["delta"] is not None and not r["delta"]["used"] and not r["delta"]["verified"])
        for case, r in doc["refused"].items()
        if case not in ("foreign_key", "replica_signed")
    }
    doc["summary"]["refused"]["foreign_key"] = doc["refused"]["foreign_key"]["rc"] != 0
    doc["summary"]["refused"]["replica_signed_push"] = signed["push_rc"] == 2
    doc["summary"]["refused"]["replica_signed_verify"] = (
        signed["unsafe_push_rc"] == 0
        and signed["verify_rc"] != 0
        and "unsafe_replica_deltas" in signed["verify_message"]
    )
    doc["load_average_at_end"] = os.getloadavg()[0]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    json.dump(doc["summary"], sys.stdout, indent=1)
    print()
    # Exit 1 unless capture did what it is for: the class compiled on the first replica, the
    # rebuilt delta verified and merged, the next replica compiled nothing for it, the poison
    # reached nothing, every bad delta was refused.
    s = doc["summary"]
    met = (
        s["verified"]
        and s["delta_origin"] == "rebuilt"
        and s["first_replica_compiled_for_the_class"] > 0
        and s["next_replica_compiled_for_the_class"] == 0
        and not s["poisoned_bytes_in_rebuilt_delta"]
        and s["record_served_waves"] > 0
        and s["record_operator_waves"] == 0
        and all(s["refused"].values())
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
