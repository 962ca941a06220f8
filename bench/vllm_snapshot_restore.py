"""A whole vLLM server snapshotted with CRIU and restored, on the GPU machine (issue 40's probe).

    PYTHONPATH=/tmp/site python3 bench/vllm_snapshot_restore.py --criu-debs .gpu/criu \\
        --model bench/models/qwen3-8b-dummy --out $OUT

For each model: a fresh start with an empty cache root (cold), a second fresh start on the
cache root the first one wrote (warm: what a baked image does), each timed from launch to
``/health``; then, on the warm server after a request warm-up and with no client connected,
the driver's checkpoint of every CUDA process in the tree (``cuCheckpointProcessLock`` and
``...Checkpoint``), ``criu dump`` of the tree (the processes exit), ``criu restore -d``, the
driver's restore and unlock, and the time from the restore's start to ``/health`` and to the
first completion. The greedy tokens of the same prompts are compared before and after, and the
files the cache root gained after the restore are counted.

The server runs under bench/no_io_uring.py: CRIU cannot dump an io_uring, and libuv (uvloop in
the API server, torch's TCPStore in the engine core) sets one up otherwise. Which processes
held a ring, and which had a GPU device open, is recorded per process.

Prints JSON; writes OUT/snapshot-restore.json after each step, and OUT/<model>/ holds the logs.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROMPTS = [list(range(1 + i, 17 + i)) for i in range(4)]
MAX_TOKENS = 16
PORT = 8000
# A fixed KV cache skips vLLM's memory profiling (another process's memory disturbs it) and
# keeps the snapshot's size readable: weights + 2 GiB + graphs.
SERVE_ARGS = [
    "--skip-tokenizer-init",
    "--gpu-memory-utilization",
    "0.5",
    "--kv-cache-memory-bytes",
    "2147483648",
    "--seed",
    "0",
    "--max-model-len",
    "4096",
    "--port",
    str(PORT),
    "--host",
    "127.0.0.1",
]
CRIU_OPTS = [
    "--tcp-established",
    "--file-locks",
    "--ghost-limit",
    "1G",
    "--link-remap",
    "--network-lock",
    "skip",
]
STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}

PR_SET_CHILD_SUBREAPER = 36


class Driver:
    """The CUDA driver's process checkpoint calls (CUDA 12.8+), on other processes by pid."""

    def __init__(self) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.cuda.cuInit(0)

    def state(self, pid: int) -> str | None:
        s = ctypes.c_int(-1)
        rc = self.cuda.cuCheckpointProcessGetState(pid, ctypes.byref(s))
        return STATES.get(s.value, str(s.value)) if rc == 0 else None

    def call(self, name: str, pid: int, timeout_ms: int = 0) -> dict[str, Any]:
        args = (ctypes.c_uint32 * 16)()
        args[0] = timeout_ms
        t = time.monotonic()
        fn = getattr(self.cuda, f"cuCheckpointProcess{name}")
        rc = fn(pid, ctypes.byref(args)) if name in ("Lock", "Checkpoint", "Restore", "Unlock") else fn(pid)
        return {"rc": rc, "s": round(time.monotonic() - t, 3)}


class Criu:
    def __init__(self, debs: Path, root: Path = Path("/tmp/cr")) -> None:
        root.mkdir(parents=True, exist_ok=True)
        for d in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(d), str(root)], check=True)
        lib = root / "usr/lib/x86_64-linux-gnu"
        self.argv = [
            str(lib / "ld-linux-x86-64.so.2"),
            "--library-path",
            f"{lib}:{root}/lib/x86_64-linux-gnu",
            str(root / "usr/sbin/criu"),
        ]

    def __call__(self, *args: str, timeout: float = 300) -> dict[str, Any]:
        t = time.monotonic()
        p = subprocess.run(self.argv + list(args), capture_output=True, text=True, timeout=timeout)
        return {"rc": p.returncode, "s": round(time.monotonic() - t, 3), "out": (p.stdout + p.stderr)[-2000:]}


def tree(root: int) -> list[int]:
    """root and every descendant, parents first."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(sorted(kids.get(pid, [])))
    return out


def fds(pid: int) -> dict[str, Any]:
    targets = []
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        with contextlib.suppress(OSError):
            targets.append(str(fd.readlink()))
    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    return {
        "pid": pid,
        "cmd": cmd,
        "fds": len(targets),
        "io_uring": sum("io_uring" in t for t in targets),
        "nvidia": sorted({t for t in targets if t.startswith("/dev/nvidia")}),
        "tcp_or_unix": sum(t.startswith("socket:") for t in targets),
    }


def http(path: str, body: dict[str, Any] | None = None, timeout: float = 2.0) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Content-Type": "application/json", "Connection": "close"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        data = r.read()
    return json.loads(data) if data else None


def healthy() -> bool:
    try:
        http("/health", timeout=1.0)
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_health(t0: float, deadline: float, proc: Any = None) -> float | None:
    while time.monotonic() < deadline:
        if healthy():
            return round(time.monotonic() - t0, 3)
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def tokens(model: str) -> list[list[int]]:
    out = []
    for p in PROMPTS:
        r = http(
            "/v1/completions",
            {
                "model": model,
                "prompt": p,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "return_token_ids": True,
            },
            timeout=120,
        )
        choice = r["choices"][0]
        out.append(choice.get("token_ids") or choice.get("text"))
    return out


def files_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def start(
    model: Path, cache: Path, log: Path, sleep: bool = False, load_format: str = "dummy"
) -> tuple[subprocess.Popen[bytes], float]:
    env = dict(
        os.environ,
        VLLM_CACHE_ROOT=str(cache),
        HOME=str(cache.parent / "home"),
        PYTHONUNBUFFERED="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    if sleep:
        # /sleep, /wake_up and /collective_rpc are dev-mode endpoints.
        env["VLLM_SERVER_DEV_MODE"] = "1"
    argv = [
        sys.executable,
        str(HERE / "no_io_uring.py"),
        "--",
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        *SERVE_ARGS,
        "--load-format",
        load_format,
        *(["--enable-sleep-mode"] if sleep else []),
    ]
    t0 = time.monotonic()
    # Its own session, no terminal, stdin from /dev/null: a tree CRIU can dump on its own.
    proc = subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=str(cache.parent),
    )
    return proc, t0


def stop(pid: int) -> None:
    for p in reversed(tree(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    reap(5)


def reap(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def snapshot_and_restore(
    name: str,
    pid: int,
    criu: Criu,
    drv: Driver,
    img: Path,
    cache: Path,
    log: Path,
    want: list[list[int]],
    r: dict[str, Any],
    sleep_level: int | None = None,
) -> None:
    if sleep_level is not None:
        t = time.monotonic()
        http(f"/sleep?level={sleep_level}", {}, timeout=120)
        r["sleep_s"] = round(time.monotonic() - t, 3)
        r["sleep_level"] = sleep_level
    pids = tree(pid)
    r["processes"] = [fds(p) for p in pids]
    gpu = [p for p in pids if drv.state(p) is not None]
    r["cuda_pids"] = gpu
    t = time.monotonic()
    r["lock"] = [drv.call("Lock", p, 10000) for p in gpu]
    r["checkpoint"] = [drv.call("Checkpoint", p) for p in gpu]
    r["driver_checkpoint_s"] = round(time.monotonic() - t, 3)
    r["processes_after_checkpoint"] = [fds(p) for p in pids]
    shutil.rmtree(img, ignore_errors=True)
    img.mkdir(parents=True)
    r["dump"] = criu("dump", "-t", str(pid), "-D", str(img), "-o", "dump.log", "-v2", *CRIU_OPTS)
    r["dump_log_tail"] = subprocess.run(
        ["tail", "-25", str(img / "dump.log")], capture_output=True, text=True
    ).stdout
    r["snapshot_bytes"] = sum(f.stat().st_size for f in img.iterdir())
    r["snapshot_files"] = len(list(img.iterdir()))
    reap(10)
    r["alive_after_dump"] = [p for p in pids if Path(f"/proc/{p}").exists()]
    if r["dump"]["rc"] != 0:
        r["in_place_restore"] = [drv.call("Restore", p) for p in gpu] + [drv.call("Unlock", p) for p in gpu]
        return
    before = files_under(cache)
    t0 = time.monotonic()
    r["restore"] = criu("restore", "-D", str(img), "-o", "restore.log", "-v2", "-d", *CRIU_OPTS)
    r["restore_log_tail"] = subprocess.run(
        ["tail", "-25", str(img / "restore.log")], capture_output=True, text=True
    ).stdout
    if r["restore"]["rc"] != 0:
        return
    t1 = time.monotonic()
    r["driver_restore"] = [drv.call("Restore", p) for p in gpu]
    r["unlock"] = [drv.call("Unlock", p) for p in gpu]
    r["driver_restore_s"] = round(time.monotonic() - t1, 3)
    r["restored_health_s"] = wait_health(t0, t0 + 120)
    if sleep_level is not None:
        try:
            http("/wake_up", {}, timeout=120)
            r["restored_awake_s"] = round(time.monotonic() - t0, 3)
            if sleep_level == 2:
                # vLLM 0.26 cannot reload `dummy` weights (NotImplementedError, HTTP 500): with
                # them the tokens after a level-2 wake-up are not comparable, and this says so.
                http("/collective_rpc", {"method": "reload_weights"}, timeout=300)
                r["restored_weights_reloaded_s"] = round(time.monotonic() - t0, 3)
        except (urllib.error.URLError, OSError) as e:
            r["restored_wake_error"] = repr(e)[:300]
            return
    try:
        got = tokens(name)
        r["restored_first_completion_s"] = round(time.monotonic() - t0, 3)
        r["tokens_identical"] = got == want
        if got != want:
            r["tokens_after"] = got
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        r["restored_requests_error"] = repr(e)[:300]
    after = files_under(cache)
    r["files_after_restore"] = sorted(set(after) - set(before))[:50]
    r["restored_alive"] = [p for p in pids if Path(f"/proc/{p}").exists()]


def real_weights(model: Path, base: Path) -> Path:
    """A safetensors checkpoint of ``model``'s config with random weights (seeded), so that a
    woken engine has files to reload (vLLM cannot reload ``dummy`` weights)."""
    out = base / "weights" / model.name
    out.mkdir(parents=True)
    code = (
        "import sys, torch, transformers as t; torch.manual_seed(0); "
        "c = t.AutoConfig.from_pretrained(sys.argv[1]); "
        "m = t.AutoModelForCausalLM.from_config(c, torch_dtype=torch.bfloat16); "
        "m.save_pretrained(sys.argv[2], safe_serialization=True)"
    )
    subprocess.run([sys.executable, "-c", code, str(model), str(out)], check=True, timeout=900)
    return out


def one_model(model: Path, args: argparse.Namespace, criu: Criu, drv: Driver, doc: dict[str, Any]) -> None:
    base = Path(args.work) / model.name
    shutil.rmtree(base, ignore_errors=True)
    (base / "home").mkdir(parents=True)
    if args.real_weights:
        t = time.monotonic()
        model = real_weights(model, base)
        doc.setdefault("weights_written_s", {})[model.name] = round(time.monotonic() - t, 1)
    name = str(model)
    cache = base / "cache"
    cache.mkdir()
    logs = args.out / model.name
    logs.mkdir(parents=True, exist_ok=True)
    r: dict[str, Any] = {}
    doc["models"][model.name] = r
    for kind in ("cold", "warm"):
        if kind == "cold" and args.skip_cold:
            continue
        proc, t0 = start(
            model,
            cache,
            logs / f"{kind}.log",
            sleep=args.sleep_level is not None,
            load_format="safetensors" if args.real_weights else "dummy",
        )
        ready = wait_health(t0, t0 + args.ready_timeout, proc)
        r[f"ready_{kind}_s"] = ready
        save(args.out, doc)
        if ready is None:
            r[f"{kind}_failed"] = subprocess.run(
                ["tail", "-30", str(logs / f"{kind}.log")], capture_output=True, text=True
            ).stdout
            stop(proc.pid)
            return
        want = tokens(name)
        r["tokens"] = want
        if kind == "cold":
            stop(proc.pid)
            continue
        time.sleep(1)  # the warm-up's connections closed on both sides
        snap = r.setdefault("snapshot", {})
        try:
            snapshot_and_restore(
                name,
                proc.pid,
                criu,
                drv,
                Path(args.images) / model.name,
                cache,
                logs / "warm.log",
                want,
                snap,
                args.sleep_level,
            )
        finally:
            save(args.out, doc)
            for p in snap.get("restored_alive") or [proc.pid]:
                stop(p)
            with contextlib.suppress(ProcessLookupError):
                stop(proc.pid)
            shutil.rmtree(Path(args.images) / model.name, ignore_errors=True)


def save(out: Path, doc: dict[str, Any]) -> None:
    (out / "snapshot-restore.json").write_text(json.dumps(doc, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--criu-debs", type=Path, required=True)
    ap.add_argument("--model", type=Path, action="append", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", default="/root/snapwork")
    ap.add_argument("--images", default="/dev/shm/snap")
    ap.add_argument("--ready-timeout", type=float, default=420)
    ap.add_argument("--skip-cold", action="store_true")
    ap.add_argument(
        "--real-weights",
        action="store_true",
        help="serve a seeded random safetensors checkpoint written from the config, not dummy weights",
    )
    ap.add_argument(
        "--sleep-level",
        type=int,
        choices=(1, 2),
        help="put the engine to sleep before the checkpoint (vLLM's sleep mode: level 2 drops the "
        "weights and the KV cache), then wake it and reload the weights after the restore",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # The server runs in a folder of its own: a relative path would read as a hub repo id.
    args.model = [m.resolve() for m in args.model]
    # Restored trees are reparented to us, so their exits are ours to reap (and the dumped
    # tree's pids come free before the restore needs them).
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    criu = Criu(args.criu_debs)
    drv = Driver()
    doc: dict[str, Any] = {
        "uname": os.uname().release,
        "criu_version": criu("--version")["out"].strip(),
        "criu_check": criu("check"),
        "serve_args": SERVE_ARGS,
        "criu_opts": CRIU_OPTS,
        "models": {},
    }
    with contextlib.suppress(Exception):
        doc["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    save(args.out, doc)
    for model in args.model:
        one_model(model, args, criu, drv, doc)
        save(args.out, doc)
    print(json.dumps(doc, indent=1)[-6000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
