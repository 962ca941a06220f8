r"""The snapshot's part of ``bench/vllm_image_flow.py --snapshot MODEL`` (issue 40 item 5): after
the baked start, on the same machine and the same image, in this order:

1. **weights files** (``--weights-from``), a checkpoint in the Hugging Face layout in the model's
   directory, so a woken engine has files to reload (vLLM cannot reload ``dummy`` weights; on
   0.32 ``reload_weights`` reads through the default loader, ``--load-format safetensors``):
   ``saved``: the baked server (started with ``VLLM_SERVER_DEV_MODE=1``) writes the weights it
   holds (vLLM's dummy values, seeded) with ``save_sharded_state`` and
   bench/sharded_to_checkpoint.py puts them back in the checkpoint's layout: the reloaded weights
   are the baked start's, and its tokens are the ones to compare with. ``generated``:
   bench/fake_checkpoint.py writes the checkpoint from the config (seeded values; the FP8 MoE's
   fused experts are a layout the converter refuses). The baked start ran on dummy values, so
   the tokens to compare with are those of a fresh start loaded from the checkpoint: the key
   mismatch's fallback (4.), which starts the baked way with the snapshot's arguments. ``auto``
   (the default): saved where the converter knows the layout, generated where it does not. The
   summary names the reference (``tokens_reference``);
2. **take**: ``kernelbake snapshot take --weights outside`` (sleep mode level 2 before the dump;
   the image is baked with ``--enable-sleep-mode``, which is in vLLM's compile hash), timed: the
   snapshot's build time and size. Without weight files it takes the weights inside;
3. **restores** through ``kernelbake serve``'s gate, the snapshot mounted as a pulled image volume
   is (a read-only overlay of its directory: the gate's fast path): with the page cache dropped
   (a node that just pulled it; serve reads the weight files beside the restore, which this flow
   once did itself as a third restore: 13.19 s against 14.82 s on the H100) and with it warm.
   The first serves the request mix (files and JIT lines after it) and the greedy tokens;
4. **key mismatch**: one more variable, timed to serve's ``snapshot not used`` line; its
   fallback, once ready, gives its greedy tokens (the reference of generated weights);
5. **bad inputs** (issue 40 item 6), each a fresh ``serve``: a tampered page file, a truncated
   image, a foreign cache key, another image digest, another GPU model, another driver, a
   snapshot.json other than the pinned one; each must be refused before any restore (no CRIU
   run, no mark), with the reason printed.

``summary`` and ``phase_table`` read the model's document. Everything that needs no GPU (the bad
inputs, the parsing of serve's lines, the CRIU wrapper, the summary) is tested in
tests/test_bench_snapshot_flow.py.

The device run on vLLM 0.32 (``bench/device.sh``; one call each, run() being the device tool;
after a call returns, the next must come within ~30 s or the machine is given back):

    # here: the bundle as chunks (22 of ~46 MiB: each plus the tree fits a call), the context,
    # and the .debs criu.lock pins (17 MB, a call of their own)
    bash bench/gpu-bundle.sh 0.32.0
    # the context holds the kernelbake wheel it was rendered with: render it again after any
    # change to the runtime (the sixth H100 run needed its spawn change in the image)
    kernelbake render bench/specs/vllm-0.32.0/qwen3-8b-sleep.yaml --gpu h200 --out .gpu/ctx
    KEEP=.gpu/bundle/criu images/base/criu/install.sh build/criu
    run(carry=[".gpu/bundle/criu"]): bash bench/device.sh stash criu
    run(carry=[".gpu/bundle/chunkK"]): bash bench/device.sh stash chunkK       # K = 1 .. N-1
    run(carry=[".gpu/bundle/chunkN", ".gpu/ctx"]): bash bench/device.sh stash chunkN &&
      bash bench/device.sh install &&
      DEBS=/root/stash/criu images/base/criu/install.sh /opt/kernelbake-criu &&
      bash bench/device.sh start snap8b -- bash -c "python3 bench/vllm_image_flow.py
        --context .gpu/ctx/qwen3-8b-sleep-h200/context --skip-checks --mix-total 100
        --snapshot qwen3-8b-sleep --criu /opt/kernelbake-criu/bin/criu --deadline 960 --out \$RUN_OUT" &&
      bash bench/device.sh collect 540
    run(): bash bench/device.sh collect 560                                   # until snap8b's rc is there

After the 8B's flow, ``bench/reload_probe.py`` asks how the restore's last phase (the weights'
reload, 13.93 s for the MoE with a warm page cache) could go faster, on the checkpoint the flow
left in the model's directory (~3 minutes, another 16.4 GB of disk for the kernel format):

    bash bench/device.sh start reload --after snap8b -- bash -c "python3 bench/reload_probe.py
      --model /models/qwen3-8b-dummy --kernel-dir /root/kfmt --out \$RUN_OUT"

On the MoE (after its flow, which leaves its generated checkpoint in ``/models/qwen3-30b-a3b-fp8``),
the kernel format (31 GB more) goes to ``/dev/shm``, the disk holding the bundle, that
checkpoint and the snapshot; ``state-copy`` then reads memory warm or "dropped" alike:

    bash bench/device.sh start reload --after snapmoe -- bash -c "python3 bench/reload_probe.py
      --model /models/qwen3-30b-a3b-fp8 --kernel-dir /dev/shm/kfmt --methods checkpoint,state-copy
      --gpu-memory-utilization 0.6 --out \$RUN_OUT"

or alone, on a checkpoint generated there (about 2 minutes after the install):

    bash bench/device.sh start reload -- bash -c "mkdir -p /models/moe &&
      cp bench/models/qwen3-30b-a3b-fp8/config.json /models/moe/ &&
      python3 bench/fake_checkpoint.py /models/moe > \$RUN_OUT/checkpoint.json &&
      python3 bench/reload_probe.py --model /models/moe --kernel-dir /dev/shm/kfmt
        --methods checkpoint,state-copy --gpu-memory-utilization 0.6 --out \$RUN_OUT"

(Never pipe ``install`` into ``tail``: the pipe hides its failure and the runs start without the
tree.) The GPU idles while the chunks go over: the call after the CRIU one can start
``bench/nvml_release_probe.py`` (the machine's torch and that CRIU; its four modes, ~1 minute)
from a copy of the tree, which the next call's checkout does not replace:

    mkdir -p /root/ptree /root/pout && cp -r src bench /root/ptree && cd /root/ptree &&
      (PYTHONPATH=src setsid nohup python3 bench/nvml_release_probe.py
        --criu /opt/kernelbake-criu/bin/criu --out /root/pout > /root/pout/probe.log 2>&1 &)

and a later call copies ``/root/pout`` to ``$OUT`` (2026-12-06, on the H100:
bench/results/vllm-0.32.0-h100-snapshot-2026-12-06-fifth). The device tool lends an H100 for
work that fits 78 GiB, both of these models included: render ``--gpu h100`` too (the 0.32 specs target both) and pass the context of
the card ``nvidia-smi`` names; a context for the other card is refused at compile (the engine's
compile hash includes the device name). On vLLM 0.26 the same, with ``shared/gpu-testenv/build-bundle.sh``'s parts and
``bench/specs/qwen3-8b-sleep.yaml``.

The 8B run on 0.32 (2026-12-05, bench/results/vllm-0.32.0-h200-snapshot-2026-12-05-partial):
compile 226 s, cold 203 s, baked 29 s, the weights written and converted (16.4 GB) 41 s; then
take (~45 s expected), three restores, the mismatch with its baked fallback (~30 s) and seven
bad inputs: about 14 minutes in its own session. The FP8 MoE's fused experts are a layout
bench/sharded_to_checkpoint.py refuses, so its weights are generated (``--weights-from
generated``: 31.2 GB in 7 files, 37,491 tensors of bench/models/qwen3-30b-a3b-fp8; about 40 s at this host's 0.4 GB/s, the
device's disk is faster), which its disk must hold beside the bundle and the snapshot. The MoE
(its compile alone took 539-566 s on 0.26; ``--baked-only`` leaves its cold start, 428.8 s on
0.26, out: ``--merge`` takes a cold start only from a run of the same image key, and no 0.32 run
has one yet, so the summary says the cold start is missing rather than borrow 0.26's; a session
with ~8 more minutes drops ``--baked-only``) as a second run, after it or in the next device
session (~16 minutes; the context rendered here first, ``kernelbake render
bench/specs/vllm-0.32.0/qwen3-30b-a3b-fp8-sleep.yaml --gpu h200 --out .gpu/ctx``, and carried
with the last chunk as above):

      bash bench/device.sh start snapmoe --after snap8b -- bash -c "python3 bench/vllm_image_flow.py
        --context .gpu/ctx/qwen3-30b-a3b-fp8-sleep-h200/context --skip-checks --mix-total 100
        --baked-only qwen3-30b-a3b-fp8-sleep --snapshot qwen3-30b-a3b-fp8-sleep
        --weights-from generated --criu /opt/kernelbake-criu/bin/criu --deadline 1100
        --out \$RUN_OUT"

Its restores' tokens are compared with the key mismatch's fallback (a start loaded from the
generated checkpoint), which is waited for while 60 s of the deadline are left.

With its weights beside (``--snapshot-weights beside``: the engine's weight memory saved in the
snapshot and copied back after the wake-up, no reload) the snapshot holds the MoE's 31.3 GB
besides CRIU's 3.5 GB, and the device's 60 GB of disk do not also hold the generated
checkpoint (the run of 2026-12-06 stopped on ENOSPC during take): ``--model-dir`` keeps the
model's files on tmpfs, the model's path a link to them:

      bash bench/device.sh start snapmoe -- bash -c "python3 bench/vllm_image_flow.py
        --context .gpu/ctx32/qwen3-30b-a3b-fp8-sleep-h100/context --skip-checks --mix-total 100
        --baked-only qwen3-30b-a3b-fp8-sleep --snapshot qwen3-30b-a3b-fp8-sleep
        --weights-from generated --snapshot-weights beside --model-dir /dev/shm/moe
        --criu /opt/kernelbake-criu/bin/criu --deadline 1150 --out \$RUN_OUT"

Each writes ``$RUN_OUT/vllm-image-flow.json``: ``summary[MODEL]`` has ``ready_cold_s``,
``ready_baked_s``, ``ready_restored_s``, ``snapshot_bytes`` and the rest of ``summary()`` below;
``snapshot_phases`` is the phase table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.contract.snapshot import (
    ENGINE_LOG,
    IMAGES_DIR,
    SHM_COPY,
    SNAPSHOT_MANIFEST,
    WEIGHTS_EXTENSION,
    FileKind,
    SnapshotFile,
    SnapshotManifest,
    file_kind,
)
from kernelbake.oci.types import sha256_digest
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.snapshot import tree
from kernelbake.runtime.snapshot.devguard import MIDDLEWARE

# Its sibling script (bench/ is not a package; vllm_image_flow.py puts it on the path too).
sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_checkpoint
import sharded_to_checkpoint
import snapshot_pages
from criu_log import criu_time_by_work, criu_waits
from snapshot_pages import drop_caches  # the page cache emptied, so a restore reads from disk

SAY = "kernelbake serve: "
RESTORED = SAY + "restored snapshot"
REFUSED = SAY + "snapshot not used: "
TARGET_S = {"qwen3-8b": 10.0, "qwen3-30b-a3b-fp8": 15.0}
_PHASE = re.compile(
    r"(criu restore|driver restore|/health|/is_sleeping|woken|weights reloaded|weights copied) ([0-9.]+) s"
)
_SERVING = re.compile(r"serving ([0-9.]+) s after the start of the restore")
_CHECKED = re.compile(r"; (\d+ files checked by [^;]*?) in ([0-9.]+) s before it\)")
# Only this tree's serve is parsed (vllm_image_flow refuses a context with another wheel).
_READ_AHEAD = re.compile(
    r"; (\d+) B read ahead beside it \(the snapshot's \d+ image files?, then \d+ weight files?(, still reading)?\)"
)
# How the model's weight files are made for a snapshot with the weights outside (--weights-from):
# saved from the baked server and converted, generated from the config (bench/fake_checkpoint.py),
# or saved where the converter knows the layout and generated where it does not.
WEIGHTS_FROM = ("auto", "saved", "generated")
# How a snapshot taken asleep gets its weights back (--snapshot-weights): ``outside``, vLLM's
# reload from the model's files; ``beside``, the engine's weight memory saved in the snapshot and
# copied back (kernelbake.runtime.engines.vllm.snapshot_weights). Without weight files: inside.
ASLEEP = ("outside", "beside")
SEED = 0
# The tokens a restore is compared with: the baked start's when the restored engine holds its
# weights (inside the snapshot, or saved from it); a start loaded from the checkpoint when the
# weights were generated (the baked start ran on dummy values, not those files).
REF_BAKED = "baked start (its weights: inside the snapshot or saved from it)"
REF_CHECKPOINT = "key-mismatch fallback: a fresh start loaded from the generated checkpoint"


def snapshot_args(
    user_args: Sequence[str], port: int, *, weights_files: bool, beside: bool = False
) -> list[str]:
    """The user arguments of every snapshot start: the flow's, with the weights loaded from the
    files the baked server wrote (when it did), the development endpoints' guard, the worker
    extension that keeps the weights beside the snapshot (``beside``), and the port (the flow's
    servers append ``--port``; take's start must have the same arguments)."""
    args = list(user_args)
    if weights_files and "--load-format" in args:
        # The checkpoint make_weights wrote (saved or generated), through vLLM's default loader:
        # the path a user's weights take, and the one whose reload_weights works on 0.32
        # (sharded_state has none).
        args[args.index("--load-format") + 1] = "safetensors"
    extension = ["--worker-extension-cls", WEIGHTS_EXTENSION] if beside else []
    return [*args, "--middleware", MIDDLEWARE, *extension, "--port", str(port)]


def image_digest(target_json: Path) -> str:
    """The flow builds no image manifest: the digest stands for target.json's, and says so."""
    return sha256_digest(target_json.read_bytes())


def parse_restored(line: str) -> dict[str, Any]:
    """serve's ``restored snapshot …`` line as numbers: seconds from the restore's start to
    serving, each phase, how the files were checked, and how much was read ahead."""
    out: dict[str, Any] = {"phases_s": {k: float(v) for k, v in _PHASE.findall(line)}}
    if m := _SERVING.search(line):
        out["serving_after_restore_start_s"] = float(m.group(1))
    if m := _CHECKED.search(line):
        out["files_checked"], out["files_checked_s"] = m.group(1), float(m.group(2))
    if m := _READ_AHEAD.search(line):
        # serve's reader of the images and weight files: how far it got by serving, and whether
        # it was done.
        out["read_ahead_bytes"], out["read_ahead_done"] = int(m.group(1)), not m.group(2)
    return out


def said(lines: Sequence[tuple[float, str]], prefix: str) -> tuple[float, str] | None:
    """The first of a server's (time, line) that starts with ``prefix``."""
    return next(((t, ln.strip()) for t, ln in lines if ln.startswith(prefix)), None)


# Bad inputs: each a snapshot root, the environment that changes, and the words of its refusal.


@dataclasses.dataclass(frozen=True)
class Bad:
    name: str
    root: Path
    env: Mapping[str, str]
    expect: str


def _linked_copy(src: Path, dest: Path, *, copied: str | None = None) -> Path:
    """``src`` again at ``dest`` with hard links (a snapshot is GBs), ``copied`` a real copy."""
    for dirpath, _dirs, names in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for n in names:
            s, d = Path(dirpath) / n, dest / rel / n
            if (rel / n).as_posix() == copied:
                shutil.copyfile(s, d)
            else:
                os.link(s, d)
    return dest


def _rekeyed(src: Path, dest: Path, **changes: Any) -> tuple[Path, str]:
    """The snapshot with its key changed (as if one with that key had been verified and pinned)
    and snapshot.json's new digest."""
    manifest = SnapshotManifest.from_json((src / SNAPSHOT_MANIFEST).read_bytes(), source=str(src))
    (dest / IMAGES_DIR).mkdir(parents=True)
    _linked_copy(src / IMAGES_DIR, dest / IMAGES_DIR)
    key = manifest.key.replace(**changes)
    environment = manifest.environment
    changed = dataclasses.replace(manifest, key=key, environment=environment)
    (dest / SNAPSHOT_MANIFEST).write_text(changed.to_json())
    return dest, file_digest(dest)


def file_digest(snapshot: Path) -> str:
    """What admission pins: the sha256 of snapshot.json's bytes as they are (sign and serve's
    gate hash the file, not a manifest written again from what was read)."""
    return sha256_digest((snapshot / SNAPSHOT_MANIFEST).read_bytes())


def _largest(src: Path, prefix: str) -> str:
    found = [p for p in (src / IMAGES_DIR).iterdir() if p.name.startswith(prefix) and p.is_file()]
    return max(found, key=lambda p: p.stat().st_size).relative_to(src).as_posix()


def bad_inputs(src: Path, work: Path, pin: str) -> list[Bad]:
    """The snapshot ``src`` made bad in each of issue 40 item 6's ways under ``work``; ``pin``:
    its snapshot.json's digest (what admission verified)."""
    work.mkdir(parents=True, exist_ok=True)
    pages = _largest(src, "pages-")
    tampered = _linked_copy(src, work / "tampered", copied=pages)
    with (tampered / pages).open("r+b") as fh:
        fh.seek((tampered / pages).stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    small = min(
        (p for p in (src / IMAGES_DIR).glob("*.img") if p.stat().st_size > 1), key=lambda p: p.stat().st_size
    ).relative_to(src)
    truncated = _linked_copy(src, work / "truncated", copied=small.as_posix())
    os.truncate(truncated / small, (truncated / small).stat().st_size - 1)
    manifest = SnapshotManifest.from_json((src / SNAPSHOT_MANIFEST).read_bytes(), source=str(src))
    foreign, foreign_pin = _rekeyed(
        src,
        work / "foreign-key",
        cache_key=dataclasses.replace(
            manifest.key.cache_key, max_model_len=manifest.key.cache_key.max_model_len + 1
        ),
    )
    gpu, gpu_pin = _rekeyed(src, work / "other-gpu", gpu="NVIDIA H100 80GB HBM3, 81559 MiB, 132 SMs")
    driver, driver_pin = _rekeyed(src, work / "other-driver", driver="580.95.05")
    other = "sha256:" + "0" * 64
    return [
        Bad("tampered page file", tampered, {}, f"{pages}: sha256"),
        Bad("truncated image", truncated, {}, "recorded (truncated or replaced)"),
        Bad("foreign key", foreign, {"KERNELBAKE_SNAPSHOT_DIGEST": foreign_pin}, "cache key"),
        Bad(
            "another image digest",
            src,
            {"KERNELBAKE_IMAGE_DIGEST": other},
            f"image {manifest.key.image} recorded",
        ),
        Bad("another GPU model", gpu, {"KERNELBAKE_SNAPSHOT_DIGEST": gpu_pin}, "GPU "),
        Bad("another driver", driver, {"KERNELBAKE_SNAPSHOT_DIGEST": driver_pin}, "driver "),
        Bad(
            "another snapshot.json than the pinned one",
            src,
            {"KERNELBAKE_SNAPSHOT_DIGEST": other},
            "admission verified",
        ),
    ]


def judged(bad: Bad, lines: Sequence[tuple[float, str]], marks: Path) -> dict[str, Any]:
    """What a bad input's start said, and whether it was refused as it must be: before any
    restore (a refusal, not a failed attempt, which would name a mark), the reason expected,
    nothing marked."""
    refusal = said(lines, REFUSED)
    restored = said(lines, RESTORED)
    marked = sorted(p.name for p in marks.iterdir()) if marks.is_dir() else []
    ok = (
        refusal is not None
        and restored is None
        and bad.expect in refusal[1]
        and "this node is marked" not in refusal[1]
        and not marked
    )
    return {
        "refused_before_restore": ok,
        "said": refusal[1][len(SAY) :] if refusal else None,
        "said_after_s": refusal[0] if refusal else None,
        "restored": restored is not None,
        "marked": marked,
    }


# On the device: the machine's own state (page cache, mounts).


def mount_pulled(snapshot: Path, root: Path, empty: Path) -> None:
    """``snapshot`` at ``root`` as containerd mounts a two-layer image volume: an overlay of
    lower layers alone, read-only."""
    unmount(root)
    root.mkdir(parents=True, exist_ok=True)
    empty.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={empty}:{snapshot}", str(root)], check=True
    )


def unmount(root: Path) -> None:
    if root.is_symlink():
        root.unlink()
        return
    while subprocess.run(["mountpoint", "-q", str(root)]).returncode == 0:
        subprocess.run(["umount", str(root)], check=True)
    if root.is_dir():
        root.rmdir()


def point(root: Path, target: Path) -> None:
    """``root`` a link to ``target``: a plain directory, hashed by the gate."""
    unmount(root)
    root.symlink_to(target)


def weight_files(model: Path) -> list[Path]:
    return sorted(p for p in model.glob("*.safetensors") if p.is_file())


def save_weights(port: int, model: Path) -> dict[str, Any]:
    """The running server's weights written into ``model`` as vLLM's sharded state, then in the
    checkpoint's layout (bench/sharded_to_checkpoint.py says why)."""
    t = time.monotonic()
    body = {"method": "save_sharded_state", "kwargs": {"path": str(model)}}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/collective_rpc",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
    except (urllib.error.URLError, OSError) as exc:
        return {"ok": False, "error": repr(exc)[:400], "s": round(time.monotonic() - t, 2)}
    saved = round(time.monotonic() - t, 2)
    try:
        converted = sharded_to_checkpoint.convert(model)
    except (OSError, ValueError) as exc:
        # A layout the converter does not know: no weight files, so the snapshot keeps the
        # weights inside (take's other path), and this says why.
        for p in model.glob(sharded_to_checkpoint.SHARDED):
            p.unlink()
        return {
            "ok": False,
            "made": "saved",
            "refused": True,
            "saved_s": saved,
            "error": f"not converted to a checkpoint: {exc}"[:400],
        }
    files = weight_files(model)
    return {
        "ok": bool(files),
        "made": "saved",
        "s": round(time.monotonic() - t, 2),
        "saved_s": saved,
        "split_tensors": converted["split"],
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in files),
    }


def generate_weights(model: Path, seed: int = SEED) -> dict[str, Any]:
    """A checkpoint made up from ``model``'s config.json (bench/fake_checkpoint.py says why)."""
    t = time.monotonic()
    try:
        made = fake_checkpoint.write(model, seed)
    except (OSError, ValueError) as exc:
        return {
            "ok": False,
            "made": "generated",
            "error": repr(exc)[:400],
            "s": round(time.monotonic() - t, 2),
        }
    return {"ok": True, "made": "generated", **made}


def make_weights(how: str, port: int, model: Path) -> dict[str, Any]:
    """The model's weight files for the snapshot, ``how`` one of WEIGHTS_FROM; ``auto`` saves
    what the converter can split and generates the rest (without saving first where the config
    already tells that it cannot)."""
    if how not in WEIGHTS_FROM:
        raise ValueError(f"--weights-from {how}: one of {WEIGHTS_FROM}")
    if how == "generated":
        return generate_weights(model)
    if how == "auto" and (
        why := sharded_to_checkpoint.refuses(json.loads((model / "config.json").read_text()))
    ):
        return {**generate_weights(model), "not_saved": why}
    saved = save_weights(port, model)
    if how == "auto" and saved.get("refused"):
        return {**generate_weights(model), "saved_first": saved}
    return saved


def tokens_reference(doc: Mapping[str, Any]) -> tuple[str, list[int] | None]:
    """What the restored tokens are compared with, and those tokens."""
    snap = doc.get("snapshot") or {}
    made = (doc.get("snapshot_weights") or {}).get("made")
    if (snap.get("take") or {}).get("weights") in ASLEEP and made == "generated":
        return REF_CHECKPOINT, (snap.get("mismatch") or {}).get("tokens")
    return REF_BAKED, (doc.get("warm_generate") or {}).get("tokens")


def wait_said(lines: list[tuple[float, str]], proc: Any, prefixes: Sequence[str], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if any(said(lines, p) for p in prefixes):
            return
        time.sleep(0.05)


# The summary and the phase table.


def summary(doc: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The issue's figures for one model: cold, baked and restored launch → ready, the snapshot's
    size and build time, the restore's phases, the mismatch's fallback, the bad inputs."""
    snap = doc.get("snapshot") or {}
    restores = snap.get("restores") or {}
    first = restores.get("restored") or {}
    base = model.removesuffix("-dummy").removesuffix("-sleep")
    target = TARGET_S.get(base)
    ready = first.get("ready_s")
    reference, ref_tokens = tokens_reference(doc)
    weights = doc.get("snapshot_weights") or {}
    bad = snap.get("bad_inputs") or {}
    return {
        "ready_cold_s": (doc.get("serve_cold") or {}).get("ready_s"),
        "ready_baked_s": (doc.get("serve_warm") or {}).get("ready_s"),
        "ready_restored_s": ready,
        "snapshot_bytes": (snap.get("take") or {}).get("bytes"),
        "snapshot_files": (snap.get("take") or {}).get("files"),
        "snapshot_take_s": (snap.get("take") or {}).get("wall_s"),
        "snapshot_weights": (snap.get("take") or {}).get("weights"),
        "restored_health_s": first.get("health_s"),
        "restored_phases_s": first.get("phases_s"),
        "ready_restored_warm_cache_s": (restores.get("restored-warm") or {}).get("ready_s"),
        "target_restored_s": target,
        "met": ready <= target if ready is not None and target is not None else None,
        "weights_made": weights.get("made"),
        "weights_made_s": weights.get("s"),
        "weights_bytes": weights.get("bytes"),
        "tokens_reference": reference,
        "tokens_identical_restored": first.get("tokens") == ref_tokens
        if first.get("tokens") and ref_tokens
        else None,
        "files_added_after_ready_restored": first.get("files_added_after_ready_count"),
        "compile_lines_after_ready_restored": first.get("compile_lines_after_ready"),
        "key_mismatch_fallback_s": (snap.get("mismatch") or {}).get("said_after_s"),
        "key_mismatch_said": (snap.get("mismatch") or {}).get("said"),
        "key_mismatch_ready_s": (snap.get("mismatch") or {}).get("ready_s"),
        "bad_inputs_refused": {k: v.get("refused_before_restore") for k, v in bad.items()},
        "failed": snap.get("failed"),
    }


def phase_table(models: Mapping[str, Mapping[str, Any]]) -> str:
    """Seconds, per model: cold and baked launch → /health, and each restore's phases."""
    rows = ["| model | start | phase | s |", "|---|---|---|---:|"]
    for model, doc in models.items():
        for start, key in (("cold", "serve_cold"), ("baked", "serve_warm")):
            if (doc.get(key) or {}).get("ready_s") is not None:
                rows.append(f"| {model} | {start} | launch → /health | {doc[key]['ready_s']} |")
        snap = doc.get("snapshot") or {}
        if (w := doc.get("snapshot_weights")) and w.get("made"):
            rows.append(f"| {model} | weights | files {w['made']}, {w.get('bytes')} B | {w.get('s')} |")
        if take := snap.get("take"):
            rows.append(
                f"| {model} | take | snapshot build ({take.get('weights')}), {take.get('bytes')} B | {take.get('wall_s')} |"
            )
        for name, r in (snap.get("restores") or {}).items():
            if r.get("restore_start_s") is not None:
                rows.append(
                    f"| {model} | {name} | launch → restore start (python, gate, files) | {r['restore_start_s']} |"
                )
            for phase, s in (r.get("phases_s") or {}).items():
                rows.append(f"| {model} | {name} | {phase} | {s} |")
            rows.append(f"| {model} | {name} | **launch → serving** | **{r.get('ready_s')}** |")
        if (m := snap.get("mismatch")) and m.get("said_after_s") is not None:
            rows.append(f"| {model} | key mismatch | launch → `snapshot not used` | {m['said_after_s']} |")
    return "\n".join(rows)


def lines_of(server: Any) -> Iterator[tuple[float, str]]:
    yield from list(server.lines)


# The phases on the device, driven by vllm_image_flow (``flow``: that module, for its Server,
# request mix and file watching).


@dataclasses.dataclass(frozen=True)
class Setup:
    flow: Any  # bench/vllm_image_flow, as loaded
    run: Any  # its _Flow: the baked image on this machine
    snapshot: Path  # what take writes
    root: Path  # where serve looks for a snapshot (the flow's target is moved: /opt/kernelbake/snapshot)
    work: Path
    args: list[str]  # serve's user arguments at take and at every restore
    env: dict[str, str]  # take's environment; every restore's is this and the pins
    # One port for take and every restore (CRIU gives a restored server the socket it had),
    # free when the run starts, so that flows side by side do not answer each other.
    port: int


def take(s: Setup, weights: str) -> dict[str, Any]:
    cmd = [
        *s.run.argv[: s.run.argv.index("serve")],
        "snapshot",
        "take",
        "--out",
        str(s.snapshot),
        "--image-digest",
        s.env["KERNELBAKE_IMAGE_DIGEST"],
        "--weights",
        weights,
        "--deadline",
        "120",
        # The engine's arguments whole (take has a --port of its own, serve none).
        "--",
        *s.args,
    ]
    env = {k: v for k, v in s.env.items() if k not in ("KERNELBAKE_IMAGE_DIGEST",)}
    t = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd="/", capture_output=True, text=True, timeout=900)
    wall = round(time.monotonic() - t, 2)
    (s.run.logs / "snapshot-take.log").write_text(proc.stdout + proc.stderr)
    out: dict[str, Any] = {
        "rc": proc.returncode,
        "wall_s": wall,
        "weights": weights,
        "said": proc.stdout.splitlines()[-3:],
    }
    if proc.returncode != 0:
        out["error"] = (proc.stdout + proc.stderr)[-2000:]
        # The engine's own account of a failed take (the H200 run of 2026-12-05 came back with
        # take's line alone), and CRIU's (take's scratch folder does not come back): kept beside
        # take's log.
        with contextlib.suppress(OSError):
            shutil.copyfile(ENGINE_LOG, s.run.logs / "snapshot-take-engine.log")
        for log in sorted(RuntimeEnv.from_env(s.env).scratch.glob("kernelbake-snapshot-*/dump.log")):
            with contextlib.suppress(OSError):
                shutil.copyfile(log, s.run.logs / f"snapshot-take-criu-{log.parent.name}.log")
        return out
    manifest = SnapshotManifest.from_json((s.snapshot / SNAPSHOT_MANIFEST).read_bytes(), source="take")
    out.update(
        files=len(manifest.files),
        bytes=manifest.total_bytes,
        bytes_by_kind=bytes_by_kind(manifest.files),
        largest=[[f.path, f.size] for f in sorted(manifest.files, key=lambda f: -f.size)[:8]],
        taken=dict(manifest.taken),
        digest=file_digest(s.snapshot),
        # What the engine held on the GPU awake: serve's gate wants that much free.
        device_bytes=manifest.device_bytes,
    )
    if checked := room(manifest.taken, out["bytes_by_kind"]):
        out["room"] = checked
    # Whether a restore could read fewer bytes off the disk (zero pages, compression): seconds.
    try:
        out["pages"] = snapshot_pages.profile(snapshot_pages.page_files(s.snapshot))
        out["dev_shm"] = snapshot_pages.profile(
            sorted(p for p in (s.snapshot / SHM_COPY).rglob("*") if p.is_file())
        )
    except OSError as exc:
        out["pages"] = {"error": repr(exc)[:300]}
    return out


def pages_probe(s: Setup) -> dict[str, Any]:
    """bench/snapshot_pages.py's pack probe over the snapshot take wrote, next to it on the disk."""
    try:
        return snapshot_pages.pack_probe(
            snapshot_pages.page_files(s.snapshot), s.work / "pack-probe", drop_caches
        )
    except (OSError, ValueError) as exc:
        return {"error": repr(exc)[:300]}


def room(taken: Mapping[str, float], by_kind: Mapping[str, int]) -> dict[str, Any] | None:
    """Take's room check (its estimate, made before the dump) against what the dump and the copy
    of /dev/shm then wrote; the weights beside are saved before it and are not in its count."""
    need = taken.get("room_need_bytes")
    written = sum(v for k, v in by_kind.items() if k != "weights")
    if not need or not written:
        return None
    return {"need_bytes": int(need), "written_bytes": written, "need_over_written": round(need / written, 4)}


def bytes_by_kind(files: Sequence[SnapshotFile]) -> dict[str, int]:
    """Where a snapshot's bytes are: the processes' memory pages (CRIU's ``pages-*.img``), the
    copy of /dev/shm, everything else CRIU wrote. A cold-cache restore reads all of them beside
    the weights, so they are what a smaller snapshot would have to lose (the 8B's 3.78 GB are
    0.63 s over 10 s at this disk's 2 GB/s, bench/results/vllm-0.32.0-h100-snapshot-2026-12-06-seventh)."""
    out = {kind.value: 0 for kind in FileKind}
    for f in files:
        out[file_kind(f.path).value] += f.size
    return out


def clear_shm(names: Sequence[str]) -> list[str]:
    """The machine's /dev/shm files of these names removed (a container's /dev/shm is its own;
    this machine's outlives each start, and serve puts the snapshot's back only where none is)."""
    gone = []
    for n in names:
        p = Path("/dev/shm") / n
        if p.is_file():
            p.unlink()
            gone.append(n)
    return gone


def shm_names(snapshot: Path) -> list[str]:
    return sorted(p.name for p in (snapshot / IMAGES_DIR / "dev-shm").glob("*") if p.is_file())


def tree_pids(snapshot: Path) -> list[int]:
    """The pids of the dumped tree, as its snapshot.json records them."""
    manifest = SnapshotManifest.from_json((snapshot / SNAPSHOT_MANIFEST).read_bytes(), source="tree")
    return [pid for pid, _ in manifest.tree]


def reap(snapshot: Path) -> list[int]:
    """Processes of the dumped tree's pids still alive after serve stopped (CRIU restores each
    with its pid, so a straggler would fail the next restore): killed, and named."""
    left = tree.in_use(tree_pids(snapshot))
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # Not this flow's children: gone once init reaped them (a GPU process takes a while).
    deadline = time.monotonic() + 30
    while tree.in_use(left) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def past_tree_pids(
    snapshot: Path, margin: int = 10_000, counter: Path = Path("/proc/sys/kernel/ns_last_pid")
) -> int | None:
    """Moves the kernel's next pid past the dumped tree's: CRIU restores every process and thread
    with its recorded id and leaves the counter among them, so a process started after one restore
    (serve's own, a thread of this flow) can hold an id the next restore needs ("Can't fork for
    3421: File exists", the 0.32 H100 run of 2026-12-06; serve's gate now refuses such a restore
    before CRIU runs). Threads take ids too, hence the margin. Never moved back; root only; None
    where it cannot."""
    top = max(tree_pids(snapshot), default=0) + margin
    try:
        if int(counter.read_text()) < top:
            counter.write_text(f"{top}\n")
    except (OSError, ValueError):
        return None
    return top


def clear_marks(marks: Path) -> list[str]:
    """Marks of a failed restore, listed and removed, so that the next restore is tried."""
    found = sorted(p.name for p in marks.glob("*")) if marks.is_dir() else []
    for n in found:
        (marks / n).unlink()
    return found


def keep_restore_log(scratch: Path, dest: Path) -> str | None:
    """The newest restore's CRIU log (serve leaves it in its scratch folder) copied to ``dest``;
    its text, None where there is none."""
    log = max(scratch.glob("kernelbake-restore-*/restore.log"), key=lambda p: p.stat().st_mtime, default=None)
    if log is None:
        return None
    with contextlib.suppress(OSError):
        shutil.copyfile(log, dest)
    try:
        return log.read_text(errors="replace")
    except OSError:
        return None


def restored(s: Setup, name: str, *, drop: bool, waves: Any) -> dict[str, Any]:
    """One restore through serve's gate, timed from launch to serve's ``restored snapshot`` line
    (after the weights' reload); with ``waves``, the tokens and the request mix after it."""
    clear_shm(shm_names(s.snapshot))
    out: dict[str, Any] = {
        "cache_root_put_back": s.flow.as_the_image(s.run),
        "page_cache_dropped": drop_caches() if drop else False,
        "next_pid_from": past_tree_pids(s.snapshot),
    }
    dirs = s.flow.watched_dirs(s.run.cache_root, s.env)
    launch = s.flow.snapshot(dirs)
    server = s.flow.Server(
        f"serve-{name}",
        [*s.run.argv[: s.run.argv.index("serve") + 1], *s.args[:-2]],
        s.env,
        s.port,
        s.run.logs,
    )
    wait_said(server.lines, server.proc, (RESTORED, REFUSED), 300)
    done = said(server.lines, RESTORED)
    if done is None:
        out["failed"] = (said(server.lines, REFUSED) or (0, "no line"))[1]
    else:
        out["ready_s"] = done[0]
        out.update(parse_restored(done[1]))
        out["restore_start_s"] = round(done[0] - out.get("serving_after_restore_start_s", 0.0), 2)
        out["health_s"] = server.ready_s
        if waves is not None:
            out["tokens"] = server.generate(s.run.model_path).get("tokens")
            mix = (
                s.flow.after_ready(server, s.run.model_path, dirs, launch, waves) if s.run.a.mix_total else {}
            )
            out["files_added_after_ready_count"] = mix.get("files_added_after_ready_count")
            out["request_mix_ok"] = (mix.get("request_mix") or {}).get("ok")
    stopped = server.stop()
    # The restored engine's own output goes on in serve's engine log (serve's line says where),
    # not in serve's: kept beside it, for what the reload and the requests said.
    with contextlib.suppress(OSError):
        shutil.copyfile(ENGINE_LOG, s.run.logs / f"serve-{name}-engine.log")
    log = keep_restore_log(RuntimeEnv.from_env(s.env).scratch, s.run.logs / f"serve-{name}-criu-restore.log")
    out["criu_longest_waits"] = None if log is None else criu_waits(log)
    out["criu_time_by_work"] = None if log is None else criu_time_by_work(log)
    out["compile_lines_after_ready"] = stopped.get("compile_lines_after_ready")
    out["kernelbake_lines"] = stopped.get("kernelbake_lines")
    out["marks_left"] = clear_marks(Path(s.env["KERNELBAKE_SNAPSHOT_MARKS"]))
    out["killed_after_stop"] = reap(s.snapshot)
    return out


def refused(
    s: Setup, name: str, env: Mapping[str, str], *, until_ready: bool = False
) -> tuple[list[tuple[float, str]], list[int] | None]:
    """A serve that must not restore: its lines until the refusal (and, ``until_ready``, until the
    baked start answers /health, and its greedy tokens), then stopped."""
    s.flow.as_the_image(s.run)
    server = s.flow.Server(
        f"serve-{name}",
        [*s.run.argv[: s.run.argv.index("serve") + 1], *s.args[:-2]],
        dict(env),
        s.port,
        s.run.logs,
    )
    wait_said(server.lines, server.proc, (REFUSED, RESTORED), 120)
    tokens = None
    if until_ready:
        s.flow.wait_ready(server, time.monotonic(), 300)
        if server.ready_s is not None:
            tokens = server.generate(s.run.model_path).get("tokens")
    lines = list(server.lines)
    ready = server.ready_s
    server.stop()
    return ([*lines, (ready or -1.0, "READY")] if until_ready else lines), tokens


def mismatch(s: Setup, *, reference: bool) -> dict[str, Any]:
    """A key mismatch: serve's refusal and its fallback, the baked start with the snapshot's
    arguments, so loaded from the weight files when they are outside. ``reference``: its tokens
    are what the restores are compared with (generated weights), so it is waited for with less
    time left."""
    env = {**s.env, "BENCH_SNAPSHOT_MISMATCH": "1"}
    lines, tokens = refused(s, "mismatch", env, until_ready=s.run.left() > (60 if reference else 150))
    found = said(lines, REFUSED)
    ready = next((t for t, ln in lines if ln == "READY"), None)
    return {
        "said": found[1][len(SAY) :] if found else None,
        "said_after_s": found[0] if found else None,
        "ready_s": ready if ready and ready > 0 else None,
        "restored": said(lines, RESTORED) is not None,
        "tokens": tokens,
    }


def bad(s: Setup, pin: str) -> dict[str, Any]:
    marks = Path(s.env["KERNELBAKE_SNAPSHOT_MARKS"])
    out = {}
    for b in bad_inputs(s.snapshot, s.work / "bad", pin):
        point(s.root, b.root)
        lines, _ = refused(s, "bad-" + b.name.replace(" ", "-"), {**s.env, **b.env})
        out[b.name] = judged(b, lines, marks)
    shutil.rmtree(s.work / "bad", ignore_errors=True)
    return out


def skip_lock(criu: str, at: Path) -> str:
    """A wrapper of ``criu`` that dumps and restores with ``--network-lock skip``: the device has
    no iptables, which CRIU's default lock runs (bench/results/vllm-0.26.0-h200-snapshot-2026-12-04;
    safe here: take waits until no client is connected, and the tree's own loopback connections
    are frozen with it). Version and check go through unchanged, so the key is the same."""
    at.write_text(
        "#!/bin/sh\n"
        f'case "$1" in dump|restore) exec {criu} "$@" --network-lock skip ;; esac\n'
        f'exec {criu} "$@"\n'
    )
    at.chmod(0o755)
    return str(at)


def take_failed(taken: Mapping[str, Any]) -> str | None:
    """Why ``take`` failed, from its last line (take's own error), or None: the summary's
    "failed" says it, rather than null beside a snapshot of None bytes (the 0.32 H100 run of
    2026-12-05, whose take the driver refused)."""
    if taken["rc"] == 0:
        return None
    lines = str(taken.get("error") or "").strip().splitlines()
    return f"take exited {taken['rc']}: {lines[-1] if lines else 'no output'}"[:600]


def run(
    flow: Any,
    run_: Any,
    doc: dict[str, Any],
    waves: Any,
    criu: str,
    asleep: str = "outside",
    so_far: Callable[[], None] = lambda: None,
    pages_probe_after_take: bool = False,
) -> None:
    """Every snapshot phase for the model of ``run_`` (its baked start already ran and, with
    weights written, left them in the model's directory); into ``doc["snapshot"]``, calling
    ``so_far`` after each phase: a device lease taken back mid-flow (2026-12-07, during the
    8B's take) then still brings back every phase that ended."""
    snap: dict[str, Any] = {}
    doc["snapshot"] = snap
    target = Path(run_.runtime_env["KERNELBAKE_UNSAFE_TARGET"])
    work = flow.WORK / "snapshot"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # Weights outside or beside need vLLM's sleep mode baked in (it is in the compile hash) and
    # the files the baked server wrote (the start a snapshot beside is taken from loads them);
    # otherwise the snapshot holds them (the slower path, still measured).
    baked_asleep = "--enable-sleep-mode" in json.loads(target.read_text())["serve"]["extra_args"]
    made = doc.get("snapshot_weights") or {}
    weights_files = baked_asleep and bool(made.get("ok"))
    env = {
        **run_.run_env,
        "VLLM_SERVER_DEV_MODE": "1",
        "KERNELBAKE_CRIU": skip_lock(criu, work / "criu"),
        "KERNELBAKE_IMAGE_DIGEST": image_digest(target),
        "KERNELBAKE_SNAPSHOT_MARKS": str(work / "marks"),
    }
    port = flow._free_port()
    s = Setup(
        flow,
        run_,
        work / "taken",
        target.parent / "snapshot",
        work,
        snapshot_args(
            run_.argv[run_.argv.index("serve") + 1 :],
            port,
            weights_files=weights_files,
            beside=weights_files and asleep == "beside",
        ),
        env,
        port,
    )
    try:
        unmount(s.root)
        # Left by the cold and baked starts: take would carry them into the snapshot.
        snap["shm_cleared_before_take"] = clear_shm(sorted(p.name for p in Path("/dev/shm").glob("psm_*")))
        snap["cache_root_put_back_before_take"] = flow.as_the_image(run_)
        snap["take"] = take(s, asleep if weights_files else "inside")
        so_far()
        if (why := take_failed(snap["take"])) is not None:
            snap["failed"] = why
            return
        if pages_probe_after_take:
            snap["pages_probe"] = pages_probe(s)
            so_far()
        pin = snap["take"]["digest"]
        s.env["KERNELBAKE_SNAPSHOT_DIGEST"] = pin
        mount_pulled(s.snapshot, s.root, work / "empty")
        snap["restores"] = restores = {}
        restores["restored"] = restored(s, "restored", drop=True, waves=waves)
        so_far()
        if run_.left() > 120 and weights_files:
            restores["restored-warm"] = restored(s, "restored-warm", drop=False, waves=None)
            so_far()
        snap["mismatch"] = mismatch(s, reference=weights_files and made.get("made") == "generated")
        snap["tokens_reference"] = tokens_reference(doc)[0]
        so_far()
        snap["bad_inputs"] = bad(s, pin)
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as exc:
        snap["failed"] = repr(exc)[:600]
    finally:
        unmount(s.root)
