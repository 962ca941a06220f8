r"""Capture on a GPU without Docker (issue 42 item 5): record, rebuild, and the next replica, for
one rendered vLLM image, in one run on the device machine.

    kernelbake render bench/specs/tiny-llama-ref.yaml --gpu h200 --out .gpu/ctx          # on the host
    python3 bench/vllm_capture.py --context .gpu/ctx/tiny-llama-ref-h200/context --out $RUN_OUT  # on the GPU

The image is played as ``bench/vllm_image_flow.py`` plays it (the rendered stages executed on the
machine, the bundle at the target's cache root, ``kernelbake serve`` as the entrypoint); each
"container" starts from a copy of the final stage's cache root, as a container of the image
would, one at a time:

1. **replica**: serves ``CLASSES``, each alone, after ``/health``: requests the build's warm-up
   does not cover, which make a baked vLLM 0.26/0.32 engine (the V2 model runner) JIT-compile
   Triton kernels (``CLASSES`` says which and why). What each gained in the cache root, HOME and
   TMPDIR; then a line is appended to a kernel the replica compiled (the poisoned replica),
   ``kernelbake capture record`` (no ``--request``: the classes are the ones ``serve`` noted) and
   ``capture collect`` (the replica's own bytes) run as in the container;
2. **rebuild**: a fresh copy of the bundle, the same entrypoint with ``--load-format dummy``,
   ``capture replay`` of the record and ``capture collect``, judged against the record's claims
   (``contract.reproduced``) and stamped ``origin: rebuilt``, as ``capture rebuild`` does;
3. **next replica**: a fresh copy again, the rebuilt delta at ``/opt/kernelbake/delta`` and
   ``$KERNELBAKE_DELTA_DIGEST`` its ``delta.json``'s sha256 (what admission pins after verifying the
   signature); the same classes, and what they gained;
4. **rebake** (``--rebake``, time allowing): the compile stage again into an empty root, its
   manifest against the first bake's, per kind: how deterministic a whole build is, for the kinds a
   request after ``/health`` does not reach (Inductor, FlashInfer, vLLM's AOT artifact).

On the device (``bench/device.sh``; the 0.26.0 bundle of ``shared/gpu-testenv/build-bundle.sh``
repacked by ``bash bench/device.sh chunk 44`` into five chunks, one per call, so that each fits
beside the tree; the context rendered here, for h200 and h100, carried with the last chunk)::

    run(carry=[".gpu/bundle/chunk1"]): bash bench/device.sh stash chunk1     # likewise 2 to 4
    run(carry=[".gpu/bundle/chunk5", ".gpu/ctx"]): ctx=tiny-llama-ref-h200;
        nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 && ctx=tiny-llama-ref-h100;
        bash bench/device.sh install &&
        bash bench/device.sh start capture --private-opt -- bash -c "python3 bench/vllm_capture.py
          --context .gpu/ctx/$ctx/context --deadline 560 --out \$RUN_OUT" &&
        bash bench/device.sh collect 540
    run(): bash bench/device.sh collect 560                # until the run's rc is there

331 s of run on the H200 on 2026-12-05 (bake 234 s, three baked starts of 28-32 s, the
classes; no second bake), after a 26 s install: bench/results/vllm-0.26.0-h200-capture-2026-12-05.

Not here: the signature. There is no registry or cosign on the device machine; pushing, signing
and ``capture verify`` read ``delta.json`` and the base image's labels the same way for any GPU and
are measured on the CPU image (``bench/capture_cpu.py``). Writes ``OUT/vllm-capture.json``, logs
under ``OUT/logs``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))
import vllm_image_flow as flow
from kernelbake.contract.delta import DELTA_MANIFEST, DeltaManifest
from kernelbake.contract.manifest import Manifest
from kernelbake.contract.record import CaptureRecord, made_up_prompt
from kernelbake.contract.reproduced import judge, stamp

# Sent alone, in order, to the first replica and to the next one. Read in vLLM 0.26.0's and
# 0.32.0's source (the V2 model runner, which both use for a dense model on a GPU):
# - ``logprobs_20``: ``compute_token_logprobs`` launches ``_topk_log_softmax_kernel`` with the
#   constexpr ``TOPK_BLOCK_SIZE = next_power_of_2(1 + logprobs)``; the build's warm-up asks for at
#   most 5 logprobs (blocks of 1, 4 and 8), 20 needs a block of 32: a new specialisation.
# - ``logprob_token_ids``: the per-request logprob tokens take ``_fill_logprob_token_ids_kernel``,
#   which no warm-up request reaches (``NUM_TOPK`` and ``PADDED_COLS`` are constexprs).
CLASSES: dict[str, dict[str, Any]] = {
    "logprobs_20": {"max_tokens": 8, "logprobs": 20, "temperature": 0.7, "top_k": 3},
    "logprob_token_ids": {
        "max_tokens": 8,
        "temperature": 0.0,
        "logprobs": 2,
        "logprob_token_ids": [100, 101, 102, 103, 104],
    },
}
PROMPT_TOKENS = 24
# Appended to a kernel the replica compiled: what a sidecar on the volume could do.
POISON = b"\nkernelbake-bench: poisoned by the replica\n"
BUILDER = "bench-device"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ask(port: int, model: str, name: str, salt: int) -> dict[str, Any]:
    """One request of the class ``name``; its status and seconds."""
    body = {
        "model": model,
        "prompt": made_up_prompt(PROMPT_TOKENS, 1000 + salt),
        "return_tokens_as_token_ids": True,
        **CLASSES[name],
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            status, text = r.status, ""
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode(errors="replace")[:300]
    except (urllib.error.URLError, OSError) as exc:
        status, text = 0, f"{type(exc).__name__}: {exc}"[:300]
    return {
        "status": status,
        "seconds": round(time.monotonic() - started, 3),
        **({"error": text} if text else {}),
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def poison_target(paths: list[str]) -> str | None:
    """The kernel binary the poison goes into: a compiled Triton kernel's ``.cubin`` first (what
    the GPU runs on a hit), else an Inductor module, else any new file."""
    for suffix in (".cubin", ".so", ".py"):
        if found := sorted(p for p in paths if p.endswith(suffix)):
            return found[0]
    return sorted(paths)[0] if paths else None


def determinism(first: dict[str, str], second: dict[str, str], names: tuple[str, str]) -> dict[str, Any]:
    """Per kind (a path's first part), two builds' files (path: sha256): counts, same paths,
    same bytes, and which differ (the first 20 of each)."""
    one, two = names
    out: dict[str, Any] = {}
    for kind in sorted({p.split("/")[0] for p in (*first, *second)}):
        mine = {p: h for p, h in first.items() if p.startswith(kind + "/")}
        theirs = {p: h for p, h in second.items() if p.startswith(kind + "/")}
        both = mine.keys() & theirs.keys()
        out[kind] = {
            f"{one}_files": len(mine),
            f"{two}_files": len(theirs),
            "same_paths": len(both),
            "same_bytes": sum(mine[p] == theirs[p] for p in both),
            "other_bytes": sorted(p for p in both if mine[p] != theirs[p])[:20],
            f"only_{one}": sorted(mine.keys() - theirs.keys())[:20],
            f"only_{two}": sorted(theirs.keys() - mine.keys())[:20],
        }
    return out


def manifest_files(manifest: Manifest) -> dict[str, str]:
    return {f.path: f.sha256 for f in manifest.files}


@dataclasses.dataclass
class Image:
    """The baked image on this machine: its entrypoint, environments, and a copy of the final
    stage's cache root that each container starts from."""

    context: Path
    plan: dict[str, list[tuple[str, str]]]
    cache_root: Path
    model: str
    argv: list[str]
    runtime_env: dict[str, str]
    final_env: dict[str, str]
    pristine: Path
    logs: Path
    started: float
    deadline: float

    def left(self) -> float:
        return self.deadline - (time.monotonic() - self.started)

    def env(self, phase: str, **extra: str) -> dict[str, str]:
        """A container's environment: HOME and TMPDIR of its own, its notes outside them."""
        notes = flow.WORK / f"notes-{phase}" / "kernelbake-misses.jsonl"
        return {**flow._phase_env(self.final_env, phase), "KERNELBAKE_MISS_NOTES": str(notes), **extra}

    def fresh(self, delta: Path | None = None) -> None:
        """The cache root as the image holds it, and a delta mounted or none."""
        flow.remove(self.cache_root)
        shutil.copytree(self.pristine, self.cache_root, symlinks=True)
        mounted = self.cache_root.parent / "delta"
        flow.remove(mounted)
        if delta is not None:
            shutil.copytree(delta, mounted)

    def kernelbake(self, env: dict[str, str], *args: str, log: str) -> dict[str, Any]:
        """``python3 -m kernelbake ARGS`` in a container's environment."""
        done = subprocess.run(
            [sys.executable, "-m", "kernelbake", *args], env=env, cwd="/", capture_output=True, text=True
        )
        (self.logs / f"{log}.log").write_text(done.stdout + done.stderr)
        return {"rc": done.returncode, "lines": (done.stdout + done.stderr).strip().splitlines()[-20:]}


def bake(context: Path, out: Path, started: float, deadline: float) -> tuple[Image, dict[str, Any]]:
    """The rendered stages, as the image flow runs them; the bundle kept as the image's copy."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    plan = flow.stages(context / "Dockerfile")
    target = json.loads((context / "target.json").read_text())
    cache_root = Path(target["cache_root"])
    model = next(p.split("=", 1)[1] for p in target["key"].split(";") if p.startswith("model_path="))
    flow.empty(flow.WORK)
    for p in (cache_root, Path(model), Path("/opt/kernelbake/target.json"), cache_root.parent / "delta"):
        flow.remove(p)
    doc: dict[str, Any] = {"key": target["key"], "steps": []}
    t0 = time.monotonic()
    entrypoint, runtime_env, final_env = flow._bake(context, plan, cache_root, logs, doc["steps"], doc)
    doc["bake_wall_s"] = round(time.monotonic() - t0, 1)
    pristine = flow.WORK / "image-cache-root"
    shutil.copytree(cache_root, pristine, symlinks=True)
    image = Image(
        context=context,
        plan=plan,
        cache_root=cache_root,
        model=model,
        argv=[*entrypoint, *flow.USER_ARGS],
        runtime_env=runtime_env,
        final_env=final_env,
        pristine=pristine,
        logs=logs,
        started=started,
        deadline=deadline,
    )
    return image, doc


def serve_classes(image: Image, name: str, env: dict[str, str]) -> tuple[flow.Server, dict[str, Any]]:
    """A container of the image, ready, sent each class alone; what each made its directories gain."""
    dirs = flow.watched_dirs(image.cache_root, env)
    server = flow.Server(name, image.argv, env, _free_port(), image.logs)
    flow.wait_ready(server, image.started, image.deadline)
    doc: dict[str, Any] = {"ready_s": server.ready_s, "classes": {}}
    if server.ready_s is None:
        return server, doc
    for i, cls in enumerate(CLASSES):
        before = flow.snapshot(dirs)
        answer = ask(server.port, image.model, cls, i)
        gained, again = flow.changes(before, flow.snapshot(dirs), dirs)
        files = flow.cache_files(gained)
        doc["classes"][cls] = {**answer, "files_added": files, "files_added_count": flow.count(files)}
        doc["classes"][cls]["autotune_rebenchmarked"] = again
    return server, doc


def _new_files(image: Image) -> list[str]:
    """The cache root's files that the image's bundle does not hold."""
    baked = set(flow._files(image.pristine))
    return sorted(f for f in flow._files(image.cache_root) if f not in baked)


def replica(image: Image, work: Path) -> dict[str, Any]:
    """The first replica: the classes compile; poisoned; recorded; its own bytes collected."""
    image.fresh()
    env = image.env("replica")
    server, doc = serve_classes(image, "replica", env)
    try:
        new = _new_files(image)
        doc["new_files"] = new
        doc["clean_sha256"] = {p: sha256(image.cache_root / p) for p in new}
        if (victim := poison_target(new)) is not None:
            with (image.cache_root / victim).open("ab") as fh:
                fh.write(POISON)
            doc["poisoned"] = {"path": victim, "sha256": sha256(image.cache_root / victim)}
        doc["notes"] = _notes(Path(env["KERNELBAKE_MISS_NOTES"]))
        doc["record"] = image.kernelbake(
            env, "capture", "record", "--out", str(work / "record.json"), "--replica", "replica", log="record"
        )
        doc["collect"] = image.kernelbake(
            env,
            "capture",
            "collect",
            "--out",
            str(work / "replica-delta"),
            "--replica",
            "replica",
            log="collect",
        )
    finally:
        doc["server"] = server.stop()
    return doc


def _notes(path: Path) -> list[Any]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()[:64] if line.strip()]


def rebuild(image: Image, work: Path) -> dict[str, Any]:
    """``capture rebuild`` without Docker: the image's bundle afresh, fake weights (the flow's
    arguments), the record replayed, what compiled collected, judged and stamped. The device
    machine reaches nothing outside it, as ``--network none`` would have it."""
    image.fresh()
    env = image.env("rebuild")
    server = flow.Server("rebuild", image.argv, env, _free_port(), image.logs)
    record, staging = work / "record.json", work / "rebuilt-collected"
    doc: dict[str, Any] = {}
    started = time.monotonic()
    try:
        flow.wait_ready(server, image.started, image.deadline)
        if server.ready_s is None:
            doc["failed"] = "the rebuild's server was not ready before the deadline"
            return doc
        doc["replay"] = image.kernelbake(
            env, "capture", "replay", "--record", str(record), "--port", str(server.port), log="replay"
        )
        doc["collect"] = image.kernelbake(
            env, "capture", "collect", "--out", str(staging), "--replica", "rebuild", log="rebuild-collect"
        )
    finally:
        doc["server"] = server.stop()
        doc["seconds"] = round(time.monotonic() - started, 1)
    if not (staging / DELTA_MANIFEST).is_file():
        doc["compiled_nothing"] = True
        return doc
    doc.update(finish(record, staging, work / "delta", image_digest=_pinned_digest(image)))
    return doc


def _pinned_digest(image: Image) -> str:
    """No OCI image on the device: the bundle's pinned manifest names what was run."""
    pinned = image.cache_root.parent / "pinned-manifest.json"
    return "sha256:" + sha256(pinned)


def finish(record_file: Path, staging: Path, out: Path, *, image_digest: str) -> dict[str, Any]:
    """The collected files judged against the record's claims and stamped as rebuilt into ``out``."""
    record = CaptureRecord.from_json(record_file.read_bytes(), source=str(record_file))
    collected = DeltaManifest.from_json((staging / DELTA_MANIFEST).read_text(), source=str(staging))
    found = judge(record, collected.files)
    delta = stamp(collected, record, builder=BUILDER, image=image_digest, dropped=found.dropped)
    flow.remove(out)
    shutil.copytree(staging, out)
    (out / DELTA_MANIFEST).write_text(delta.to_json())
    return {
        "files": {f.path: f.sha256 for f in delta.files},
        "reproduced": list(found.reproduced),
        "differed": list(found.differed),
        "dropped": list(found.dropped),
        "extra": list(found.extra),
        "per_kind": found.per_kind,
        "delta_json_sha256": "sha256:" + sha256(out / DELTA_MANIFEST),
        "record_waves": [w.to_json() for w in record.waves],
        "record_classes": [r.to_json() for r in record.requests],
    }


def next_replica(image: Image, work: Path, digest: str) -> dict[str, Any]:
    """A fresh container with the rebuilt delta mounted and pinned, sent the same classes."""
    image.fresh(delta=work / "delta")
    env = image.env("next", KERNELBAKE_DELTA_DIGEST=digest)
    server, doc = serve_classes(image, "next-replica", env)
    doc["server"] = server.stop()
    doc["merged"] = [ln for ln in doc["server"]["kernelbake_lines"] if "cache delta" in ln]
    return doc


def rebake(image: Image) -> dict[str, Any]:
    """The compile stage again into an empty root: its manifest against the first bake's."""
    aside = image.cache_root.with_name(image.cache_root.name + "-served")
    flow.remove(aside)
    image.cache_root.rename(aside)
    steps: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        env = flow._phase_env(image.runtime_env, "rebake")
        flow.Stage(image.context, env, image.logs, steps, Path("/")).run(
            "rebake", image.plan["compile"][1:], {}
        )
        first = Manifest.from_json((image.pristine / "manifest.json").read_text(), source="first bake")
        second = Manifest.from_json((image.cache_root / "manifest.json").read_text(), source="second bake")
        per_kind = determinism(manifest_files(first), manifest_files(second), ("first_bake", "second_bake"))
        return {"wall_s": round(time.monotonic() - t0, 1), "per_kind": per_kind}
    except SystemExit as exc:
        return {"failed": str(exc), "steps": steps}
    finally:
        flow.remove(image.cache_root)
        aside.rename(image.cache_root)


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """What the run shows, as the issue asks it."""
    first, rebuilt, nxt = doc.get("replica", {}), doc.get("rebuild", {}), doc.get("next_replica", {})
    compiled = {c: v.get("files_added_count") for c, v in first.get("classes", {}).items()}
    after = {c: v.get("files_added_count") for c, v in nxt.get("classes", {}).items()}
    poisoned = first.get("poisoned") or {}
    in_delta = set((rebuilt.get("files") or {}).values())
    waves = rebuilt.get("record_waves") or []
    # capture replay names each request the server refused ("kernelbake capture: request W.I:
    # HTTP 400: …"): a class the rebuild could not send is a class its delta lacks.
    refused = [
        line
        for line in (rebuilt.get("replay") or {}).get("lines", [])
        if line.startswith("kernelbake capture: request ")
    ]
    lines = (nxt.get("server") or {}).get("compile_lines_after_ready") or []
    wrote = any(after.values())
    loaded = flow.loaded_first_launches(lines, wrote)
    compiled_after = [ln for ln in lines if ln not in loaded]
    return {
        "first_replica_files_per_class": compiled,
        "record_served_waves": sum(w["source"] == "served" for w in waves),
        "record_operator_waves": sum(w["source"] == "operator" for w in waves),
        "rebuilt_files": len(rebuilt.get("files") or {}),
        "rebuild_replay_refused": refused,
        "rebuild_dropped": rebuilt.get("dropped"),
        "next_replica_merged": nxt.get("merged"),
        "next_replica_files_per_class": after,
        "next_replica_compile_lines_after_ready": compiled_after,
        "next_replica_loaded_first_launches": loaded,
        "poisoned_bytes_in_rebuilt_delta": poisoned.get("sha256") in in_delta if poisoned else None,
        "poisoned_named_as_other_bytes": poisoned.get("path") in (rebuilt.get("differed") or []),
        "replica_delta_origin": first.get("replica_delta_origin"),
        "met": bool(
            any(compiled.values())
            and waves
            and all(w["source"] == "served" for w in waves)
            and not refused
            and nxt.get("merged")
            and not wrote
            and not compiled_after
            and poisoned
            and poisoned.get("sha256") not in in_delta
        ),
    }


def run(a: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "bench": "vllm_capture",
        "command": " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_at_start": os.getloadavg()[0],
        "classes": CLASSES,
        "user_args": list(flow.USER_ARGS),
    }
    out_json = a.out / "vllm-capture.json"
    work = flow.WORK / "capture"
    try:
        image, doc["bake"] = bake(a.context.resolve(), a.out, started, a.deadline)
        work.mkdir(parents=True, exist_ok=True)
        for step, fn in (("replica", replica), ("rebuild", rebuild)):
            doc[step] = fn(image, work)
            out_json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        origin = work / "replica-delta" / DELTA_MANIFEST
        if origin.is_file():
            doc["replica"]["replica_delta_origin"] = json.loads(origin.read_text()).get("origin", "replica")
        if digest := doc["rebuild"].get("delta_json_sha256"):
            doc["next_replica"] = next_replica(image, work, digest)
            clean = doc["replica"]["clean_sha256"]
            doc["determinism"] = determinism(clean, doc["rebuild"]["files"], ("replica", "rebuilt"))
        if a.rebake and image.left() > a.rebake_min_left:
            doc["rebake"] = rebake(image)
        elif a.rebake:
            doc["skipped"] = [f"rebake: {image.left():.0f} s left"]
    except SystemExit as exc:
        doc["failed"] = str(exc)
    doc["summary"] = summary(doc)
    doc["wall_s"] = round(time.monotonic() - started, 1)
    doc["load_average_at_end"] = os.getloadavg()[0]
    out_json.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return doc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--context", type=Path, required=True, help="the rendered image's context (target.json, Dockerfile)"
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--deadline", type=float, default=900.0, help="seconds for the whole run")
    p.add_argument("--rebake", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--rebake-min-left", type=float, default=260.0, help="seconds a rebake needs left")
    p.add_argument(
        "--serve-args",
        help="every start's user arguments, one string (default: the image flow's USER_ARGS; the FP8 "
        "MoE, for DeepGEMM's determinism at --rebake, needs its own memory settings)",
    )
    a = p.parse_args()
    if a.serve_args is not None:
        flow.USER_ARGS[:] = shlex.split(a.serve_args)
    doc = run(a)
    print(json.dumps(doc["summary"], indent=1, default=str))
    return 0 if doc["summary"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
