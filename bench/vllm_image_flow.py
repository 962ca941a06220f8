"""A rendered vLLM image's life on a GPU machine that has no Docker: build stages, then run.

    kernelbake render bench/specs/tiny-llama-ref.yaml --gpu h200 --out build/gpu-flow   # on the host
    kernelbake render bench/specs/qwen3-8b-dummy.yaml --gpu h200 --out build/gpu-flow
    PYTHONPATH=/tmp/site python3 bench/vllm_image_flow.py \\
        --context build/gpu-flow/tiny-llama-ref-h200/context \\
        --context build/gpu-flow/qwen3-8b-dummy-h200/context \\
        --target tiny-llama-ref=6 --target qwen3-8b-dummy=5 --importtime --out $OUT   # on the GPU

The GPU machine has vLLM 0.26.0 installed like the base image has it, but no Docker, so this
executes the rendered Dockerfile itself, instruction by instruction, as root on the machine:

  runtime  RUN (the pip install of the kernelbake wheel, its bind mount emulated), COPY, ENV;
  compile  ``RUN python3 -m kernelbake compile`` (the CDI ``--device`` flag dropped: the GPU is
           already there), with its own HOME and TMPDIR;
  caches   ``COPY --from=compile`` of the cache root into a staging directory;
  final    the cache root emptied (the final stage starts from ``runtime``, which never saw
           the compile), then the ``COPY --from=caches`` layers put back.

Then what ``docker run`` would do, with a HOME and TMPDIR of its own: the ENTRYPOINT with
``check --json``; a cold start (``KERNELBAKE_CACHE=off``) and then the baked start, each alone
on the machine, timed from launch until ``/health`` answers (polled every 0.1 s), each followed
by the request mix of ``bench/request_mix.py`` (``--mix-total``; the files the bundle, HOME and
TMPDIR gained, or rewrote with other bytes, until /health and during the mix, every compile or JIT line logged after
/health, each class's first-request latency), one greedy completion over HTTP and SIGTERM.
A ``--snapshot MODEL`` has its cold start last, after the snapshot's phases (a take that fails
shows itself minutes sooner), unless ``--cold-first MODEL`` (a session whose first aim is the
cold and baked starts). ``--save-caches MODEL`` packs a model's caches stage into OUT/MODEL/caches.tar.xz (the FP8 MoE's: 5.3 MB),
and ``--caches-from MODEL=TAR`` bakes a later run from it instead of compiling, once its manifest
shows this context's key and this GPU model (the MoE's compile is 8 to 11 minutes of a 30-minute
device session). ``--baked-only MODEL`` leaves a model's cold start out, ``--serve-args-for MODEL=ARGS`` gives
a model its own start arguments, and ``--merge OUT IN...`` summarises several runs as one. Each start's timeline (``MARKS``, stamped as
its lines arrive) gives the breakdown (``BREAKDOWN``). Last, ``check`` with a hashed vLLM
variable changed, an unhashed one changed, and a shape-changing flag, to show which warn, and
with ``--importtime`` what each process of a start imports. Models run one after the other
(each image owns ``/opt/kernelbake``); OUT/vllm-image-flow.json is rewritten after each, and
OUT/<model>/logs/ holds every log.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# What the watcher of ``kernelbake serve`` counts, from this tree (the flow starts before its
# own runtime stage installs the wheel).
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))
import request_mix
import snapshot_flow
from kernelbake import runner
from kernelbake.contract.layout import MANIFEST, PINNED_MANIFEST_NAME
from kernelbake.errors import KernelbakeError
from kernelbake.runtime.bundle import file_sha256
from kernelbake.runtime.engines.vllm import APPENDED_LOGS, VllmEngine, evidence

WORK = Path("/opt/kernelbake-flow")
PROMPT = list(range(1, 17))
MAX_TOKENS = 16
# The cold server shares the GPU with the compile (and, briefly, the warm server): a memory
# share, and a fixed KV-cache size, which skips the memory profiling that another process
# on the GPU disturbs (vLLM refuses to start when free memory grows during it). None of these
# flags enters vLLM's compile hash.
USER_ARGS = [
    "--load-format",
    "dummy",
    "--gpu-memory-utilization",
    "0.3",
    "--kv-cache-memory-bytes",
    "2147483648",
    "--seed",
    "0",
]


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages(dockerfile: Path) -> dict[str, list[tuple[str, str]]]:
    result: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for word, rest in instructions(dockerfile):
        if word == "FROM":
            parts = rest.split()
            current = [("FROM", parts[0])]
            result[parts[-1] if len(parts) == 3 else parts[0]] = current
        else:
            current.append((word, rest))
    return result


def _flags(rest: str) -> tuple[dict[str, str], str]:
    """``--mount=type=bind,source=wheels,target=/x`` style flags before a RUN/COPY body."""
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value
        rest = rest.lstrip()
    return flags, rest


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


class Stage:
    """One stage's instructions. ``root`` is where its filesystem is: "/" for the stages built
    on the base image (this machine plays the base image), a directory for ``FROM scratch``."""

    def __init__(
        self, context: Path, env: dict[str, str], logs: Path, record: list[dict[str, Any]], root: Path
    ):
        self.context, self.env, self.logs, self.record, self.root = context, env, logs, record, root

    def run(self, name: str, body: list[tuple[str, str]], copy_from: dict[str, Path]) -> None:
        for word, rest in body:
            step: dict[str, Any] = {"stage": name, "instruction": f"{word} {rest}"[:300]}
            t0 = time.monotonic()
            if word == "ENV":
                for pair in shlex.split(rest):
                    key, _, value = pair.partition("=")
                    self.env[key] = value
            elif word == "COPY":
                flags, body_ = _flags(rest)
                src, dst = shlex.split(body_)
                base = copy_from[flags["from"]] if "from" in flags else self.context
                _copy(base / src.lstrip("/"), self.root / dst.lstrip("/"))
            elif word == "RUN":
                flags, cmd = _flags(rest)
                mount = flags.get("mount", "")
                binds = []
                if mount:
                    opts = dict(kv.split("=", 1) for kv in mount.split(","))
                    if opts.get("type") == "bind":
                        binds.append((self.context / opts["source"], Path(opts["target"])))
                    # type=secret (hf_token): only for hub models; the bench models are local.
                step["dropped_flags"] = sorted(k for k in flags if k != "mount")
                log = self.logs / f"{name}-{len(self.record)}.log"
                argv, links = with_binds(binds, cmd)
                with log.open("wb") as fh:
                    rc = subprocess.run(
                        argv, env=self.env, cwd="/", stdout=fh, stderr=subprocess.STDOUT
                    ).returncode
                for link in links:
                    link.unlink()
                step.update(rc=rc, log=log.name)
                if rc != 0:
                    step["wall_s"] = round(time.monotonic() - t0, 2)
                    self.record.append(step)
                    raise SystemExit(f"{name}: {word} failed with {rc}; see {log}")
            else:
                step["skipped"] = "metadata"
            step["wall_s"] = round(time.monotonic() - t0, 2)
            self.record.append(step)


@functools.cache
def _own_mount_namespaces() -> bool:
    """Whether this process may make a mount namespace (root, and not forbidden by the
    container it runs in)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


def with_binds(binds: list[tuple[Path, Path]], cmd: str) -> tuple[list[str], list[Path]]:
    """The argv of a RUN with its bind mounts (source, target), and the links to remove after
    it. As BuildKit makes them, visible to that RUN only: in a mount namespace of its own when
    this is root, so two flows on one machine do not take each other's target (a MoE flow
    and a dense one once raced over /tmp/kernelbake-wheels); else symlinks at the targets."""
    if not binds:
        return ["sh", "-c", cmd], []
    if _own_mount_namespaces():
        mounts = " && ".join(
            f"mkdir -p {shlex.quote(str(t))} && mount --bind {shlex.quote(str(s))} {shlex.quote(str(t))}"
            for s, t in binds
        )
        script = f"{mounts} && exec sh -c {shlex.quote(cmd)}"
        return ["unshare", "-m", "--propagation", "private", "sh", "-c", script], []
    links = []
    for source, link in binds:
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(source)
        links.append(link)
    return ["sh", "-c", cmd], links


def _files(root: Path) -> set[str]:
    out: set[str] = set()
    for dirpath, _d, names in os.walk(root):
        out.update(str(Path(dirpath, n).relative_to(root)) for n in names)
    return out


def _post(url: str, doc: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return dict(json.loads(resp.read()))


# Where a start spends its time: the first line (seconds after launch) that contains each,
# in the order a start passes them (``BREAKDOWN``). bench/warmstart_timeline.py reads old logs
# with the same table.
MARKS = {
    "kernelbake_first_line": "kernelbake serve:",
    "preflight_done": "kernelbake serve: preflight took",
    "api_server_first_line": "(APIServer pid=",
    "engine_prediction": "kernelbake: prediction from",
    "engine_core_first_line": "(EngineCore",
    "model_loaded": "Model loading took",
    "torch_compile_done": "torch.compile took",
    "graphs_captured": "Graph capturing finished",
    "engine_init_done": "init engine (profile, create kv cache, warmup model) took",
    "api_server_listening": "Starting vLLM server on",
    "forced_spawn": "We must use the `spawn` multiprocessing start method",
}
# What each segment of a start holds: (name, from mark, to mark, what happens there). The
# preflight runs alongside (``kernelbake serve`` starts the engine behind its cache gate), so
# it is reported on its own, not as a segment.
BREAKDOWN = (
    (
        "kernelbake_start",
        "launch",
        "kernelbake_first_line",
        "python3 -m kernelbake serve: interpreter, kernelbake's serve imports",
    ),
    (
        "vllm_api_server_imports",
        "kernelbake_first_line",
        "api_server_first_line",
        "vllm serve: imports, plugins, argument parsing",
    ),
    (
        "engine_core_start",
        "api_server_first_line",
        "engine_core_first_line",
        "config built, engine-core process started (spawn: its imports)",
    ),
    (
        "engine_core_to_model_loaded",
        "engine_core_first_line",
        "model_loaded",
        "device and distributed init, engine-core imports, dummy weights",
    ),
    (
        "torch_compile",
        "model_loaded",
        "torch_compile_done",
        "Dynamo/AOT artifact load and Inductor graphs (baked: loaded; cold: compiled)",
    ),
    (
        "cuda_graphs",
        "torch_compile_done",
        "graphs_captured",
        "KV cache, warm-up, FlashInfer, CUDA graph capture",
    ),
    (
        "engine_ready",
        "graphs_captured",
        "engine_init_done",
        "sampler warm-up (cold: FlashInfer JIT-compiles its top-k/top-p kernels), rest of init",
    ),
    ("api_server_ready", "engine_init_done", "api_server_listening", "API server builds its app"),
    ("health", "api_server_listening", "health_ok", "until /health answers 200 (polled every 0.1 s)"),
)


# Where vLLM says it reads and writes its compiled graphs: the hash directory names its
# compile hash, so the same directory at build and at serve means the same hash.
CACHE_DIR = re.compile(
    r"(?:Using cache directory: |Directly load AOT compilation from path )"
    r"(\S*torch_compile_cache/(?:torch_aot_compile/)?[0-9a-f]+)"
)


# A line that says something is being compiled or JIT-built (vLLM, Inductor, Triton autotune,
# FlashInfer's and DeepGEMM's builds, kernelbake's own evidence watcher).
COMPILE_LINE = re.compile(
    r"(?i)(compil|\bjit\b|jit-compil|nvcc|ninja|autotun|building .*(module|kernel)|warming up|"
    r"deep_?gemm|was not baked)"
)


# kernelbake's own verdict on the start (it matches "compil" but says nothing was).
_NOTHING_COMPILED = "start-up compiled nothing"


def compile_lines(lines: list[tuple[float, str]], after: float | None) -> list[str]:
    """The lines logged at or after ``after`` seconds that say something compiles. vLLM
    0.26's JIT monitor logs a Triton kernel's first launch in the process, also when Triton
    loads it from its cache: the files a directory gained tell the two apart."""
    if after is None:
        return []
    return [
        f"{t:.2f} {ln.rstrip()}"[:400]
        for t, ln in lines
        if t >= after and COMPILE_LINE.search(ln) and _NOTHING_COMPILED not in ln
    ]


def cache_dirs(text: str) -> list[str]:
    """The hash directories a log says vLLM used."""
    return sorted(set(CACHE_DIR.findall(text)))


def _log_dirs(path: Path) -> list[str]:
    return cache_dirs(path.read_text(errors="replace")) if path.is_file() else []


def note_marks(line: str, marks: dict[str, float], at: float) -> None:
    """Dates, at ``at``, each of ``MARKS`` that ``line`` is the first to contain."""
    for mark, text in MARKS.items():
        if mark not in marks and text in line:
            marks[mark] = at


def breakdown(timeline: dict[str, float | None]) -> list[dict[str, Any]]:
    """Seconds per segment of ``BREAKDOWN``, from one server's ``timeline_s``."""
    at = {"launch": 0.0, **{k: v for k, v in timeline.items() if v is not None}}
    out = []
    for name, start, end, what in BREAKDOWN:
        if start in at and end in at:
            out.append({"segment": name, "s": round(at[end] - at[start], 2), "what": what})
    return out


class Server:
    """The image's ENTRYPOINT started like ``docker run IMAGE ARGS...``; its output goes to
    the log unchanged, and the time of each ``MARKS`` line is noted on the way."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], port: int, logs: Path):
        self.name, self.port = name, port
        self.log = logs / f"{name}.log"
        self.fh = self.log.open("wb")
        self.marks: dict[str, float] = {}
        self.lines: list[tuple[float, str]] = []
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [*argv, "--port", str(port)], env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.ready_s: float | None = None
        # Polled from its own thread, so readiness is dated to 0.1 s whatever the main loop does.
        threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while self.proc.poll() is None and not self.poll_ready():
            time.sleep(0.1)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            now = round(time.monotonic() - self.t0, 2)
            self.fh.write(raw)
            self.fh.flush()
            line = raw.decode(errors="replace")
            self.lines.append((now, line))
            note_marks(line, self.marks, now)

    def poll_ready(self) -> bool:
        if self.ready_s is not None:
            return True
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as r:
                if r.status == 200:
                    self.ready_s = round(time.monotonic() - self.t0, 2)
                    return True
        except (urllib.error.URLError, OSError):
            pass
        return False

    def generate(self, model: str) -> dict[str, Any]:
        t0 = time.monotonic()
        doc = _post(
            f"http://127.0.0.1:{self.port}/v1/completions",
            {
                "model": model,
                "prompt": PROMPT,
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
                "return_token_ids": True,
            },
        )
        choice = doc["choices"][0]
        return {"tokens": choice.get("token_ids"), "request_s": round(time.monotonic() - t0, 3)}

    def stop(self) -> dict[str, Any]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(timeout=30)
        self.fh.close()
        text = self.log.read_text(errors="replace")
        timeline = {**self.marks, "health_ok": self.ready_s}
        return {
            "ready_s": self.ready_s,
            "timeline_s": timeline,
            "breakdown_s": breakdown(timeline),
            "compile_cache_dirs": cache_dirs(text),
            "compile_lines_after_ready": compile_lines(self.lines, self.ready_s),
            "exit_code_after_sigterm": self.proc.returncode,
            "kernelbake_lines": [ln for ln in text.splitlines() if ln.startswith("kernelbake serve:")],
            "log": self.log.name,
        }


def _check(entrypoint: list[str], env: dict[str, str], extra: list[str], logs: Path, name: str) -> Any:
    # -v: the engine's own output on stderr, into this run's log.
    argv = [*entrypoint[:-1], "check", "--json", "-v", *extra]
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd="/", capture_output=True, text=True)
    wall = round(time.monotonic() - t0, 2)
    (logs / f"{name}.log").write_text(proc.stdout + proc.stderr)
    try:
        doc: Any = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = {"unparsed": proc.stdout[-2000:]}
    return {"rc": proc.returncode, "wall_s": wall, "verdict": doc}


def _compile_report(cache_root: Path) -> dict[str, Any]:
    """What the compile stage recorded in the bundle's manifest: weights mode, peak GPU
    memory, the request warm-up."""
    path = cache_root / "manifest.json"
    if not path.is_file():
        return {}
    manifest = json.loads(path.read_text())
    report = manifest.get("compile_report") or {}
    return report if isinstance(report, dict) else {}


def _this_device(env: dict[str, str]) -> str:
    """This machine's device as the engine's probe names it, the key's ``device`` (``cpu`` for
    vLLM's CPU build), GPU 0 asked of a child process like serve asks, from this tree."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    child = {**env, "PYTHONPATH": os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)}
    try:
        return VllmEngine(functools.partial(runner.run, env=child)).probe().device
    except KernelbakeError as exc:
        raise SystemExit(f"--caches-from: {exc}") from None


def pack_caches(staging: Path, tar: Path) -> dict[str, Any]:
    """The caches stage (the bundle's manifest at its top) as one xz tar, small enough to come
    back from a device session (the FP8 MoE's 92 MiB packed to 5.3 MB) and be carried to the
    next with ``--caches-from``."""
    with tarfile.open(tar, "w:xz") as tf:
        for p in sorted(staging.iterdir()):
            tf.add(p, arcname=p.name)
    return {"path": str(tar), "bytes": tar.stat().st_size, "sha256": file_sha256(tar)}


def carried_caches(tar: Path, staging: Path, key: str, gpu: str) -> dict[str, Any]:
    """``tar`` (``pack_caches``) unpacked into ``staging`` in place of the compile, after its
    manifest shows it was compiled for this context's key on this GPU model: any other bundle
    would make the baked start a different image's, or partly cold. What was carried, for the
    run's document."""
    try:
        with tarfile.open(tar) as tf:
            members = tf.getmembers()
            # Files and folders below staging only: Debian bookworm's Python 3.11.2 (the CPU
            # base image) predates extractall's filter argument.
            odd = [
                m.name
                for m in members
                if not (m.isfile() or m.isdir()) or Path(m.name).is_absolute() or ".." in Path(m.name).parts
            ]
            if odd:
                raise SystemExit(f"{tar}: not a caches stage: {odd[:3]} are not files or folders below it")
            tf.extractall(staging, members=members)
        manifest = json.loads((staging / MANIFEST).read_text())
    except (OSError, tarfile.TarError, ValueError) as exc:
        raise SystemExit(f"{tar}: not a caches stage ({exc}): save one with --save-caches") from None
    report = manifest.get("compile_report") or {}
    builder = report.get("builder") or {}
    if manifest.get("key") != key:
        raise SystemExit(
            f"{tar}: its caches were compiled for {manifest.get('key')!r}, this context's key is "
            f"{key!r}: run the compile here (leave out --caches-from)"
        )
    if builder.get("device") != gpu:
        raise SystemExit(
            f"{tar}: its caches were compiled on {builder.get('device')!r}, this machine has "
            f"{gpu!r}: run the compile here (leave out --caches-from)"
        )
    return {
        "from": tar.name,
        "bytes": tar.stat().st_size,
        "sha256": file_sha256(tar),
        "files": len(_files(staging)),
        "compiled_on": builder,
        "compile_s_then": report.get("wall_s"),
    }


def _gpu_processes() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return ["nvidia-smi not found"]
    return subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ).stdout.splitlines()


# What each process imports before it can work, measured with ``python -X importtime`` in the
# served environment, after the timed starts (so it disturbs none of them).
IMPORTS = {
    "kernelbake_serve": "import kernelbake.cli.runtime, kernelbake.runtime.serve.start, kernelbake.runtime.serve.preflight, kernelbake.runtime.engines.vllm",
    "preflight_probe": "import torch; torch.cuda.is_available()",
    "vllm_api_server": "import vllm.entrypoints.cli.main, vllm.entrypoints.openai.api_server",
    # What `vllm serve`'s main() imports before it parses (every subcommand's module), against
    # the API server's module alone: the share of the imports that serving does not need.
    "vllm_cli_main": "import vllm.entrypoints.cli.main, vllm.entrypoints.cli.benchmark.main, "
    "vllm.entrypoints.cli.collect_env, vllm.entrypoints.cli.launch, vllm.entrypoints.cli.openai, "
    "vllm.entrypoints.cli.run_batch, vllm.entrypoints.cli.serve",
    "vllm_api_server_alone": "import vllm.entrypoints.openai.api_server",
}
# The API server's imports again with no bytecode to read (PYTHONPYCACHEPREFIX at an empty
# folder: every module compiled from source): what an image without precompiled .pyc files
# pays at each start, against ``vllm_api_server`` with the bytecode the earlier starts wrote.
NO_BYTECODE = ("vllm_api_server", "vllm_api_server_no_bytecode")


def _importtime_rows(stderr: str) -> list[tuple[int, int, int, str]]:
    """(self us, cumulative us, depth, module) per ``-X importtime`` line."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        self_us, cum_us, name = line.removeprefix("import time:").split("|", 2)
        module = name[1:]
        depth = (len(module) - len(module.lstrip(" "))) // 2
        rows.append((int(self_us), int(cum_us), depth, module.strip()))
    return rows


def importtime(env: dict[str, str], logs: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    prefix = Path(env["TMPDIR"]) / "pycache-empty"
    remove(prefix)
    runs = [(name, code, env) for name, code in IMPORTS.items()]
    runs.append((NO_BYTECODE[1], IMPORTS[NO_BYTECODE[0]], {**env, "PYTHONPYCACHEPREFIX": str(prefix)}))
    for name, code, run_env in runs:
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            env=run_env,
            cwd="/",
            capture_output=True,
            text=True,
        )
        wall = round(time.monotonic() - t0, 2)
        (logs / f"importtime-{name}.log").write_text(proc.stderr)
        rows = _importtime_rows(proc.stderr)
        out[name] = {
            "code": code,
            "rc": proc.returncode,
            "wall_s": wall,
            "modules": len(rows),
            "imports_s": round(sum(r[0] for r in rows) / 1e6, 2),
            "slowest_self_s": [
                {"module": m, "self_s": round(su / 1e6, 3)}
                for su, _cu, _d, m in sorted(rows, key=lambda r: -r[0])[:15]
            ],
            "top_level_cumulative_s": [
                {"module": m, "cumulative_s": round(cu / 1e6, 3)}
                for _su, cu, d, m in sorted((r for r in rows if r[2] == 0), key=lambda r: -r[1])[:15]
            ],
            "log": f"importtime-{name}.log",
        }
    return out


def watched_dirs(cache_root: Path, env: dict[str, str]) -> dict[str, Path]:
    """Where a start may write: the bundle, and its HOME and TMPDIR (every library's default
    cache: ~/.cache/flashinfer, ~/.triton, /tmp/torchinductor_*, the cold start's root)."""
    return {"cache_root": cache_root, "home": Path(env["HOME"]), "tmp": Path(env["TMPDIR"])}


Snapshot = dict[str, dict[str, tuple[int, int]]]


def snapshot(dirs: dict[str, Path]) -> Snapshot:
    """Per directory: each file's path with its size and modification time (``serve``'s own
    watcher's)."""
    return evidence.snapshot(dirs)


def changes(
    before: Snapshot, after: Snapshot, dirs: dict[str, Path] | None = None
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """As ``serve``'s watcher judges a start (``evidence.changes``), by directory, directories
    with none left out: (files gained, or rewritten with other bytes than the bundle's
    manifest records; baked Inductor autotune results benchmarked again, not a compile).
    Without ``dirs`` every rewrite counts."""
    baked = evidence.manifest_digests(dirs["cache_root"], dirs) if dirs and "cache_root" in dirs else None
    files, again = evidence.changes(before, after, dirs, baked)
    return _listed(files), _listed(again)


def _listed(found: dict[str, set[str]]) -> dict[str, list[str]]:
    return {name: sorted(paths) for name, paths in found.items() if paths}


# Not caches: vLLM's ZMQ sockets (``VLLM_RPC_BASE_PATH``, default TMPDIR, one uuid4 name each)
# and kernelbake's own start-up state (its status file and cache-gate verdict).
NOT_CACHE = re.compile(
    r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|kernelbake-status\.json|kernelbake-gate-[^/]+/.*)$"
)


def cache_files(files: dict[str, list[str]]) -> dict[str, list[str]]:
    """``files`` less what is not a cache (``NOT_CACHE``, at the top of TMPDIR)."""
    out = {k: [f for f in v if not (k == "tmp" and NOT_CACHE.match(f))] for k, v in files.items()}
    return {k: v for k, v in out.items() if v}


def count(files: dict[str, list[str]]) -> int:
    return sum(len(v) for v in files.values())


def mix_plan(target: dict[str, Any], total: int) -> list[list[request_mix.Request]]:
    """The request mix for a model, sized by the serve arguments its image was built with."""
    serve = target["serve"]
    return request_mix.plan(
        max_model_len=int(serve["max_model_len"]),
        max_num_seqs=int(serve["max_num_seqs"]),
        max_num_batched_tokens=int(serve["max_num_batched_tokens"]),
        tokenizer="--skip-tokenizer-init" not in serve.get("extra_args", []),
        total=total,
    )


def after_ready(
    server: Server, model: str, dirs: dict[str, Path], at_launch: Snapshot, waves: Any
) -> dict[str, Any]:
    """Once ``/health`` answers: what the start wrote until then, then the request mix, then
    what the mix made each directory gain."""
    at_ready = snapshot(dirs)
    mix = request_mix.run(
        f"http://127.0.0.1:{server.port}", model, waves, vocab=request_mix.vocab_size(model)
    )
    after = snapshot(dirs)
    start_files, start_again = changes(at_launch, at_ready, dirs)
    mix_files, mix_again = changes(at_ready, after, dirs)
    return {
        "files_added_until_ready": {k: v[:100] for k, v in start_files.items()},
        "files_added_until_ready_count": count(start_files),
        "autotune_rebenchmarked_until_ready": start_again,
        "autotune_rebenchmarked_after_ready": mix_again,
        "files_added_after_ready": {k: v[:100] for k, v in mix_files.items()},
        "files_added_after_ready_count": count(mix_files),
        # The lists above keep 100 a folder; the summary counts caches from this, uncapped (the
        # MoE's cold start on 2026-12-08 wrote 312 files after /health; the lists held 100).
        "cache_files_added_after_ready_count": count(cache_files(mix_files)),
        "request_mix": mix,
    }


def wait_ready(server: Server, started: float, deadline: float) -> None:
    # The server's own thread polls /health and dates readiness; this only waits for it.
    while server.proc.poll() is None and server.ready_s is None and time.monotonic() - started < deadline:
        time.sleep(0.1)


def serve_args(a: argparse.Namespace, model: str) -> list[str]:
    """The user arguments of every start of ``model``: its ``--serve-args-for``, else
    ``USER_ARGS``."""
    args = _for_model(a.serve_args_for, model)
    return list(USER_ARGS) if args is None else shlex.split(args)


def remove(path: Path) -> None:
    """``path`` gone, whatever it is (a link goes, not what it points at); nothing if absent."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def as_the_image(run: _Flow) -> list[str]:
    """The cache root put back as the image holds it, before a start: what earlier starts on
    this machine changed, added or removed there (their paths, sorted), restored. vLLM 0.32's
    baked 8B start rewrote two Inductor autotune results (``.best_config``) in place
    (2026-12-05, H100): the next start in the same root failed serve's integrity check (size
    273, the manifest 274) and ran cold, as a restarted container with the same writable
    layer would; a new container of the image would not."""
    image, root = run.image_root, run.cache_root
    want, have = _files(image), _files(root)

    def stamp(path: Path) -> tuple[int, int]:
        st = path.stat()
        return st.st_size, st.st_mtime_ns

    changed = sorted(rel for rel in want if rel not in have or stamp(image / rel) != stamp(root / rel))
    for rel in changed:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        remove(root / rel)
        shutil.copy2(image / rel, root / rel)
    for rel in sorted(have - want):
        remove(root / rel)
    return sorted([*changed, *(have - want)])


def empty(folder: Path) -> None:
    """``folder`` made empty, itself kept: under ``bench/device.sh start --private-opt`` it is
    a bind mount of the run's own, which cannot be removed (EBUSY)."""
    folder.mkdir(parents=True, exist_ok=True)
    for p in folder.iterdir():
        remove(p)


def flow(
    context: Path, out: Path, started: float, a: argparse.Namespace, first: bool, name: str = ""
) -> dict[str, Any]:
    """One model's image: its stages, then a cold start and a baked start, each alone on the
    machine, then the checks. Returns the model's document."""
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    plan = stages(context / "Dockerfile")
    target = json.loads((context / "target.json").read_text())
    cache_root = Path(target["cache_root"])
    model_path = next(p.split("=", 1)[1] for p in target["key"].split(";") if p.startswith("model_path="))
    empty(WORK)
    for p in (cache_root, Path(model_path), Path("/opt/kernelbake/target.json")):
        remove(p)
    if a.model_dir is not None:
        # The model's files elsewhere (a tmpfs): the device's 60 GB of disk do not hold the
        # MoE's generated checkpoint (31 GB) beside a snapshot with its weights beside (35 GB).
        remove(a.model_dir)
        a.model_dir.mkdir(parents=True)
        Path(model_path).parent.mkdir(parents=True, exist_ok=True)
        Path(model_path).symlink_to(a.model_dir)
    record: list[dict[str, Any]] = []
    user_args = serve_args(a, name)
    doc: dict[str, Any] = {
        "context": str(context),
        "key": target["key"],
        "user_args": user_args,
        "steps": record,
    }
    try:
        entrypoint, runtime_env, final_env = _bake(
            context,
            plan,
            target["key"],
            cache_root,
            logs,
            record,
            doc,
            carried=None if (tar := _for_model(a.caches_from, name)) is None else Path(tar),
            save_caches=out / "caches.tar.xz" if name in a.save_caches else None,
        )
        image_root = WORK / "image-cache-root"
        shutil.copytree(cache_root, image_root, symlinks=True)
        run = _Flow(
            context,
            plan,
            cache_root,
            model_path,
            logs,
            a,
            started,
            [*entrypoint, *user_args],
            runtime_env,
            _phase_env(final_env, "run"),
            image_root,
        )
        doc["check"] = _check(entrypoint, run.run_env, user_args, logs, "check")
        waves = mix_plan(target, a.mix_total)
        snap, cold = name in a.snapshot, name not in a.baked_only
        cold_first = cold and (not snap or name in a.cold_first)
        if not cold:
            doc.setdefault("skipped", []).append("cold start: --baked-only (device time)")
        elif cold_first:
            _cold_start(run, waves, doc)
        _baked_start(run, waves, doc, snapshot=snap)
        _so_far(out, doc)
        if snap:
            snapshot_flow.run(
                sys.modules[__name__],
                run,
                doc,
                waves,
                a.criu,
                a.snapshot_weights,
                so_far=lambda: _so_far(out, doc),
                pages_probe_after_take=a.pages_probe,
            )
            _so_far(out, doc)
            if cold and not cold_first:
                # After the snapshot's phases, so that a take that fails shows itself some four
                # minutes sooner on the device (the 8B's cold start). Its arguments load dummy
                # weights, never the files the snapshot's reload wrote into the model's directory.
                _cold_start(run, waves, doc)
        if first:
            _also_env(run, doc)
            _rebakes(run, waves, doc)
        _checks(run, entrypoint, user_args, doc)
        if first and a.importtime:
            doc["importtime"] = importtime(run.run_env, logs)
    except SystemExit as exc:
        doc["failed"] = str(exc)
    doc["wall_s"] = round(time.monotonic() - started, 1)
    doc["summary"] = summary(doc)
    return doc


def _for_model(pairs: Sequence[str], model: str) -> str | None:
    """The value of ``model``'s ``MODEL=VALUE`` among ``pairs``, if any."""
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name == model:
            return value
    return None


def _so_far(out: Path, doc: dict[str, Any]) -> None:
    """The model's document as it stands, in OUT/model-so-far.json: vllm-image-flow.json is
    written after each model, and a device lease that ends mid-model (the 8B's cold start comes
    some 10 minutes in) would otherwise take every phase measured before it along."""
    (out / "model-so-far.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


def _phase_env(env: dict[str, str], phase: str) -> dict[str, str]:
    home, tmp = WORK / f"home-{phase}", WORK / f"tmp-{phase}"
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    return {**env, "HOME": str(home), "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1"}


def _base_env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "LANG", "LD_LIBRARY_PATH")}
    # The stages run on this machine, not in an image, and device.sh --private-opt makes
    # /opt/kernelbake a mount point, which serve refuses to trust (runtime.trusted): the
    # variable named unsafe says the target is not an image's, and the verdicts say so.
    base["KERNELBAKE_UNSAFE_TARGET"] = "/opt/kernelbake/target.json"
    if shutil.which("vllm") is None:
        # The base image has vLLM's console script; this install (PYTHONPATH) has not.
        shim = WORK / "bin"
        shim.mkdir(parents=True)
        (shim / "vllm").write_text(f'#!/bin/sh\nexec {sys.executable} -m vllm.entrypoints.cli.main "$@"\n')
        (shim / "vllm").chmod(0o755)
        base["PATH"] = f"{shim}:{base.get('PATH', '/usr/bin:/bin')}"
    return base


def _bake(
    context: Path,
    plan: dict[str, list[tuple[str, str]]],
    key: str,
    cache_root: Path,
    logs: Path,
    record: list[dict[str, Any]],
    doc: dict[str, Any],
    carried: Path | None = None,
    save_caches: Path | None = None,
) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """The Dockerfile's stages run on this machine; the entrypoint, and the runtime and final
    stages' environments (each stage's ENV lines set them). With ``carried`` (a tar of an
    earlier run's caches stage) the compile and caches stages are that tar; ``save_caches``
    writes this run's caches stage as such a tar; ``key`` (target.json's) is what the tar's
    manifest must show."""
    runtime_env = _base_env()
    slash = Path("/")
    Stage(context, runtime_env, logs, record, slash).run("runtime", plan["runtime"][1:], {})
    entrypoint = json.loads(next(rest for w, rest in plan["final"] if w == "ENTRYPOINT"))
    staging = WORK / "stage-caches"
    staging.mkdir()
    if carried is not None:
        # The caches stage of an earlier run of this context on the same GPU model, as an
        # image built on one machine is pulled on another: the compile is not run here.
        doc["compile_carried"] = carried_caches(carried, staging, key, _this_device(runtime_env))
    else:
        compile_env = _phase_env(runtime_env, "build")
        t_compile = time.monotonic()
        Stage(context, compile_env, logs, record, slash).run("compile", plan["compile"][1:], {})
        doc["compile_wall_s"] = round(time.monotonic() - t_compile, 2)
        doc["compile_cache_dirs"] = _log_dirs(logs / str(record[-1].get("log", "")))
        Stage(context, {}, logs, record, staging).run("caches", plan["caches"][1:], {"compile": slash})
        # The final stage starts from runtime, which never saw the compile stage's writes.
        shutil.rmtree(cache_root)
        shutil.rmtree(WORK / "home-build")
        shutil.rmtree(WORK / "tmp-build")
        if save_caches is not None:
            save_caches.parent.mkdir(parents=True, exist_ok=True)
            doc["caches_saved"] = pack_caches(staging, save_caches)
    final_env = dict(runtime_env)
    Stage(context, final_env, logs, record, slash).run("final", plan["final"][1:], {"caches": staging})
    doc["bundle"] = {
        "files": len(_files(cache_root)),
        "manifest": (cache_root / "manifest.json").is_file(),
        "files_by_kind": {p.name: len(_files(p)) for p in sorted(cache_root.iterdir()) if p.is_dir()},
    }
    doc["compile_report"] = _compile_report(cache_root)
    return entrypoint, runtime_env, final_env


@dataclasses.dataclass(frozen=True)
class _Flow:
    """One model's baked image on this machine, for the starts and checks after the bake."""

    context: Path
    plan: dict[str, list[tuple[str, str]]]
    cache_root: Path
    model_path: str
    logs: Path
    a: argparse.Namespace
    started: float
    argv: list[str]  # the entrypoint and the user's serve arguments
    runtime_env: dict[str, str]
    run_env: dict[str, str]
    # A copy of the cache root as the final stage left it: what every container of the image
    # starts from (this machine's cache root outlives each start; a container's writes die with it).
    image_root: Path

    def left(self) -> float:
        return self.a.deadline - (time.monotonic() - self.started)


def _free_port() -> int:
    """A port no one listens on now. Fixed ports (8000, 8001) let two flows run side by side on
    the device (bench/device.sh start ... --private-opt) answer each other's /health: on
    2026-12-05 the 8B flow's cold start read the reference model's server as ready and got a
    404 for its model."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(
    run: _Flow, name: str, env: dict[str, str], port: int, waves: list[list[request_mix.Request]]
) -> tuple[Server, dict[str, Any]]:
    """A start of the image with ``env``, until ready; then (``--mix-total``) the request mix.
    The server, still up, and the mix's document (empty without one)."""
    put_back = as_the_image(run)
    dirs = watched_dirs(run.cache_root, env)
    launch = snapshot(dirs)
    server = Server(name, run.argv, env, port, run.logs)
    wait_ready(server, run.started, run.a.deadline)
    mix: dict[str, Any] = {"cache_root_put_back": put_back}
    if server.ready_s is not None and run.a.mix_total:
        mix = after_ready(server, run.model_path, dirs, launch, waves)
    return server, mix


def _cold_start(run: _Flow, waves: list[list[request_mix.Request]], doc: dict[str, Any]) -> None:
    """Cold: the same image with its caches off, alone on the machine (the compile is over)."""
    cold_env = {**_phase_env(run.runtime_env, "run-cold"), "KERNELBAKE_CACHE": "off"}
    cold, cold_mix = _start(run, "serve-cold", cold_env, _free_port(), waves)
    if cold.ready_s is not None:
        doc["cold_generate"] = cold.generate(run.model_path)
    doc["serve_cold"] = {**cold.stop(), **cold_mix}


def _baked_start(
    run: _Flow, waves: list[list[request_mix.Request]], doc: dict[str, Any], snapshot: bool = False
) -> None:
    """The baked start; for a ``--snapshot`` model with vLLM's development endpoints, which
    write the weights it holds into the model's directory for the snapshot's reload (or, with
    ``--weights-from generated``, a checkpoint made up from the config is written there)."""
    before = _files(run.cache_root)
    env = {**run.run_env, "VLLM_SERVER_DEV_MODE": "1"} if snapshot else run.run_env
    warm, warm_mix = _start(run, "serve-warm", env, _free_port(), waves)
    if warm.ready_s is not None:
        doc["warm_generate"] = warm.generate(run.model_path)
        if snapshot:
            doc["snapshot_weights"] = snapshot_flow.make_weights(
                run.a.weights_from, warm.port, Path(run.model_path)
            )
        # Which processes hold GPU memory while serving: the kernelbake supervisor
        # (pid below) should not, although its preflight imported torch.
        doc["gpu_processes_while_serving"] = {
            "kernelbake_serve_pid": warm.proc.pid,
            "nvidia_smi": _gpu_processes(),
        }
    doc["serve_warm"] = {**warm.stop(), **warm_mix}
    doc["serve_warm"]["files_added_to_cache_root"] = sorted(_files(run.cache_root) - before)[:50]


def _also_env(run: _Flow, doc: dict[str, Any]) -> None:
    """Baked starts with one more variable each (``--also-env``), while time is left."""
    for i, pair in enumerate(run.a.also_env):
        if run.left() < 90:
            doc.setdefault("skipped", []).append(f"serve with {pair}: {run.left():.0f} s left")
            continue
        var, _, value = pair.partition("=")
        put_back = as_the_image(run)
        other = Server(f"serve-warm-{i + 1}", run.argv, {**run.run_env, var: value}, _free_port(), run.logs)
        wait_ready(other, run.started, run.a.deadline)
        gen = other.generate(run.model_path) if other.ready_s is not None else None
        doc.setdefault("serve_warm_also", []).append(
            {"env": pair, "generate": gen, "cache_root_put_back": put_back, **other.stop()}
        )


def _rebakes(run: _Flow, waves: list[list[request_mix.Request]], doc: dict[str, Any]) -> None:
    for i, pair in enumerate(run.a.rebake_env):
        # A variable vLLM hashes (a compile factor) cannot be A/B'd on the baked bundle:
        # the start would miss. So the compile stage runs again with it, into an empty
        # root, and that bundle is started with it; the first bundle is put back after.
        if run.left() < run.a.rebake_min_left:
            doc.setdefault("skipped", []).append(f"rebake with {pair}: {run.left():.0f} s left")
            continue
        doc.setdefault("rebaked", []).append(
            rebake(
                pair,
                i + 1,
                run.context,
                run.plan,
                run.cache_root,
                run.logs,
                run.a,
                run.started,
                {
                    "compile": _phase_env(run.runtime_env, f"rebake-{i + 1}"),
                    "run": run.run_env,
                },
                run.argv,
                run.model_path,
                doc.get("warm_generate"),
                waves,
            )
        )


def _checks(run: _Flow, entrypoint: list[str], user_args: list[str], doc: dict[str, Any]) -> None:
    """``kernelbake check`` after the starts, with a changed variable or shape."""
    # vLLM 0.26 leaves its logging variables out of the hash: no warning expected for
    # the second; the first and the third predict a miss.
    checks = {
        "check_hashed_env_changed": ({"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}, [], "check-env"),
        "check_unhashed_env_changed": ({"VLLM_LOGGING_LEVEL": "DEBUG"}, [], "check-env-unhashed"),
        "check_shape_changed": ({}, ["--max-model-len", "2048"], "check-shape"),
    }
    if run.a.skip_checks:
        doc.setdefault("skipped", []).append("checks after the starts: --skip-checks (device time)")
        checks = {}
    for key, (extra_env, extra_args, log_name) in checks.items():
        # On the image's files, as a new container would check them: the FP8 MoE's baked start
        # rewrote two Inductor autotune results (2026-12-07, H100), and the three checks after
        # it read that root, failed its integrity and said cold.
        put_back = as_the_image(run)
        doc[key] = {
            **_check(entrypoint, {**run.run_env, **extra_env}, [*user_args, *extra_args], run.logs, log_name),
            "cache_root_put_back": put_back,
        }


def rebake(
    pair: str,
    n: int,
    context: Path,
    plan: dict[str, list[tuple[str, str]]],
    cache_root: Path,
    logs: Path,
    a: argparse.Namespace,
    started: float,
    envs: dict[str, dict[str, str]],
    argv: list[str],
    model_path: str,
    warm_generate: dict[str, Any] | None,
    waves: Any,
) -> dict[str, Any]:
    """The compile stage again with ``pair`` set, then a baked start of that bundle with it
    set too (as an image whose ENV had it), and the same request mix as the baked start (a
    factor made the default must leave nothing to compile after /health either). The first
    bundle and its pinned manifest are put back afterwards, whatever happened."""
    var, _, value = pair.partition("=")
    plain = cache_root.with_name(cache_root.name + "-plain")
    pinned = cache_root.parent / PINNED_MANIFEST_NAME
    pinned_plain = pinned.read_bytes() if pinned.is_file() else None
    remove(plain)
    cache_root.rename(plain)
    steps: list[dict[str, Any]] = []
    out: dict[str, Any] = {"env": pair, "steps": steps}
    try:
        t0 = time.monotonic()
        Stage(context, {**envs["compile"], var: value}, logs, steps, Path("/")).run(
            f"rebake{n}", plan["compile"][1:], {}
        )
        out["compile_wall_s"] = round(time.monotonic() - t0, 2)
        out["compile_cache_dirs_build"] = _log_dirs(logs / str(steps[-1].get("log", "")))
        # The image's own copy of the manifest is what serve's integrity check reads.
        shutil.copyfile(cache_root / MANIFEST, pinned)
        out["bundle_files"] = len(_files(cache_root))
        out["compile_report"] = _compile_report(cache_root)
        dirs = watched_dirs(cache_root, envs["run"])
        at_launch = snapshot(dirs)
        server = Server(f"serve-rebaked-{n}", argv, {**envs["run"], var: value}, _free_port(), logs)
        wait_ready(server, started, a.deadline)
        mix: dict[str, Any] = {}
        if server.ready_s is not None and a.mix_total:
            mix = after_ready(server, model_path, dirs, at_launch, waves)
        gen = server.generate(model_path) if server.ready_s is not None else None
        out["generate"] = gen
        out["tokens_identical_to_warm"] = bool(gen and warm_generate) and (gen or {}).get("tokens") == (
            warm_generate or {}
        ).get("tokens")
        out.update({**server.stop(), **mix})
    except SystemExit as exc:
        out["failed"] = str(exc)
    finally:
        remove(cache_root)
        plain.rename(cache_root)
        if pinned_plain is not None:
            pinned.write_bytes(pinned_plain)
    return out


def _warm_start(w: dict[str, Any]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The baked start's files until /health: (what compiled, baked Inductor autotune results
    benchmarked again). Runs recorded before ``after_ready`` kept the two apart listed both
    as files; there a rewritten ``.best_config`` is one not among the new names
    (``files_added_to_cache_root``), as ``evidence.split_rebenchmarked`` tells them apart."""
    files = cache_files(w.get("files_added_until_ready") or {})
    if "autotune_rebenchmarked_until_ready" in w:
        return files, w["autotune_rebenchmarked_until_ready"]
    # Recorded before the evidence left the engine's appended logs out (the manifest's
    # ``logs``: FlashInfer's flashinfer_jit.log, appended to at every start).
    files = {k: [f for f in v if Path(f).name not in APPENDED_LOGS] for k, v in files.items()}
    new = set(w.get("files_added_to_cache_root", []))
    again = {
        k: [f for f in v if k == "cache_root" and f.endswith(".best_config") and f not in new]
        for k, v in files.items()
    }
    kept = {k: [f for f in v if f not in again[k]] for k, v in files.items()}
    return {k: v for k, v in kept.items() if v}, {k: v for k, v in again.items() if v}


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    w, c = doc.get("serve_warm", {}), doc.get("serve_cold", {})
    start_files, start_again = _warm_start(w)
    warm_tokens = (doc.get("warm_generate") or {}).get("tokens")
    cold_tokens = (doc.get("cold_generate") or {}).get("tokens")
    return {
        "compile_wall_s": doc.get("compile_wall_s"),
        # Baked from an earlier run's caches stage (--caches-from): the tar's digest, where and
        # how long it compiled then.
        "compile_carried": doc.get("compile_carried"),
        "check_verdict": doc.get("check", {}).get("verdict", {}).get("verdict"),
        "ready_cold_s": c.get("ready_s"),
        "ready_warm_s": w.get("ready_s"),
        "speedup_ready": round(c["ready_s"] / w["ready_s"], 2)
        if c.get("ready_s") and w.get("ready_s")
        else None,
        "tokens_identical": cold_tokens == warm_tokens if warm_tokens and cold_tokens else None,
        # Launch to /health, in the bundle, HOME and TMPDIR (runs before the request mix
        # counted the bundle only).
        "files_added_at_warm_start": count(start_files)
        if "files_added_until_ready" in w
        else len(w.get("files_added_to_cache_root", [])),
        "files_added_at_warm_start_by_dir": {k: v[:20] for k, v in start_files.items()},
        "autotune_rebenchmarked_at_warm_start": start_again,
        **mix_summary(w, c),
        "weights_mode": (doc.get("compile_report") or {}).get("weights_mode"),
        "compile_peak_gpu_bytes": _peak(doc.get("compile_report") or {}),
        "request_warmup_at_build": (doc.get("compile_report") or {}).get("request_warmup"),
        "breakdown_warm_s": w.get("breakdown_s"),
        "breakdown_cold_s": c.get("breakdown_s"),
        "preflight_warm": [ln for ln in w.get("kernelbake_lines", []) if "preflight took" in ln],
        # Build, baked start and each A/B start: one set of hash directories means one hash.
        "compile_cache_dirs": {
            "build": doc.get("compile_cache_dirs"),
            "warm": w.get("compile_cache_dirs"),
            **{f"warm {o['env']}": o.get("compile_cache_dirs") for o in doc.get("serve_warm_also", [])},
        },
        "warm_also": [
            {
                "env": o["env"],
                "ready_s": o["ready_s"],
                "breakdown_s": o.get("breakdown_s"),
                "tokens_identical_to_warm": (o.get("generate") or {}).get("tokens") == warm_tokens,
            }
            for o in doc.get("serve_warm_also", [])
        ],
        "rebaked": [
            {
                "env": o["env"],
                "compile_wall_s": o.get("compile_wall_s"),
                "ready_s": o.get("ready_s"),
                "breakdown_s": o.get("breakdown_s"),
                "compile_cache_dirs": o.get("compile_cache_dirs"),
                "tokens_identical_to_warm": o.get("tokens_identical_to_warm"),
                "files_added_until_ready": count(cache_files(o.get("files_added_until_ready") or {}))
                if "files_added_until_ready" in o
                else None,
                "files_added_after_ready": count(cache_files(o.get("files_added_after_ready") or {}))
                if "files_added_after_ready" in o
                else None,
                "compile_lines_after_ready": _still_compiling(o) if "request_mix" in o else None,
                "failed": o.get("failed"),
            }
            for o in doc.get("rebaked", [])
        ],
        "check_deep_verify_wall_s": doc.get("check", {}).get("wall_s"),
        "warm_exit_code_after_sigterm": w.get("exit_code_after_sigterm"),
        # vLLM's own verdict (kernelbake check) on a hashed variable, an unhashed one and a
        # shape-changing flag: only the first and the last may predict a miss.
        "checks": {
            name: {
                "rc": c.get("rc"),
                "predicted": c.get("verdict", {}).get("predicted"),
                "reasons": (c.get("verdict", {}).get("prediction") or {}).get("reasons"),
                "notes": c.get("verdict", {}).get("notes"),
            }
            for name in (
                "check",
                "check_hashed_env_changed",
                "check_unhashed_env_changed",
                "check_shape_changed",
            )
            if (c := doc.get(name))
        },
        "failed": doc.get("failed"),
    }


def _still_compiling(start: dict[str, Any]) -> list[str]:
    """A start's compile lines after /health, timestamps and process prefix cut. Without
    ``kernelbake serve``'s report on start-up, printed when vLLM says it is up: it is about
    what happened before /health (in ``files_added_at_warm_start``), and runs recorded
    before the watcher left rewrites with the same bytes and appended logs out have it
    counting those as compiles."""
    lines = [
        ln
        for ln in start.get("compile_lines_after_ready") or []
        if _NOTHING_COMPILED not in ln and not re.match(r"^[0-9.]+ kernelbake serve: ", ln)
    ]
    return [re.sub(r"^[0-9.]+ (\(EngineCore pid=\d+\) )?", "", ln)[:200] for ln in lines]


def _peak(report: dict[str, Any]) -> int | None:
    """The compile's peak GPU memory: the larger of the peak up to the AOT save and after it
    (the counter is reset there), over the ranks vLLM reported."""
    peaks = [report.get("peak_at_aot_save_bytes"), report.get("peak_after_aot_save_bytes")]
    ranks = report.get("ranks") or {}
    for r in ranks.values() if isinstance(ranks, dict) else ranks:
        if isinstance(r, dict):
            peaks += [r.get("peak_at_aot_save_bytes"), r.get("peak_after_aot_save_bytes")]
    found = [int(p) for p in peaks if isinstance(p, (int, float))]
    return max(found) if found else None


_JIT_FIRST_LAUNCH = "Triton kernel JIT compilation during inference"


def loaded_first_launches(lines: Sequence[str], files_written: bool) -> list[str]:
    """The lines of vLLM's JIT monitor that are loads, not compiles. It logs a Triton kernel's
    first launch in the process after its warm-up, also when Triton loads the kernel from its
    cache (triton/runtime/jit.py calls jit_post_compile_hook after every in-memory miss);
    Triton writes every kernel it compiles to its cache dir, so with no file written, each of
    these was loaded. With a file written, none is taken for a load."""
    return [] if files_written else [ln for ln in lines if _JIT_FIRST_LAUNCH in ln]


def _cache_files_after_ready(start: dict[str, Any]) -> int:
    """How many cache files a start wrote after ``/health``: the uncapped count where the start
    recorded one, else (a document from before 2026-12-08) the lists it kept, 100 a folder."""
    if "cache_files_added_after_ready_count" in start:
        return int(start["cache_files_added_after_ready_count"])
    return count(cache_files(start.get("files_added_after_ready") or {}))


def mix_summary(warm: dict[str, Any], cold: dict[str, Any]) -> dict[str, Any]:
    """What the request mix after ``/health`` made each start compile, and how long each
    class's first request took, baked against cold."""
    if "request_mix" not in warm and "request_mix" not in cold:
        return {}
    wm, cm = warm.get("request_mix") or {}, cold.get("request_mix") or {}
    first_w, first_c = wm.get("first_request_latency_s", {}), cm.get("first_request_latency_s", {})
    return {
        "files_added_after_ready": _cache_files_after_ready(warm) if warm else None,
        "files_added_after_ready_cold": _cache_files_after_ready(cold) if cold else None,
        "files_added_after_ready_by_dir": {
            k: v[:20] for k, v in cache_files(warm.get("files_added_after_ready") or {}).items()
        },
        "compile_lines_after_ready": _still_compiling(warm),
        "loaded_first_launches_after_ready": loaded_first_launches(
            _still_compiling(warm), bool(count(cache_files(warm.get("files_added_after_ready") or {})))
        )
        if warm
        else [],
        "compile_lines_after_ready_cold": _still_compiling(cold) if cold else None,
        "requests_after_ready": {
            "baked": {
                k: wm.get(k)
                for k in ("requests", "ok", "failed_per_class", "concurrent_batch_sizes", "max_prompt_len")
            },
            "cold": {k: cm.get(k) for k in ("requests", "ok", "failed_per_class")} if cm else None,
        },
        "first_request_latency_s": {
            k: {"baked": first_w.get(k), "cold": first_c.get(k)} for k in sorted({*first_w, *first_c})
        },
    }


def table(result: dict[str, Any]) -> str:
    """The breakdown of each model's cold and baked start as a Markdown table (seconds)."""
    starts = []
    for model, doc in result["models"].items():
        if "serve_cold" in doc:
            starts.append((f"{model}, cold", doc["serve_cold"]))
        starts.append((f"{model}, baked", doc.get("serve_warm", {})))
        starts += [(f"{model}, baked, {o['env']}", o) for o in doc.get("serve_warm_also", [])]
    head = "| segment | " + " | ".join(name for name, _ in starts) + " |"
    rows = [head, "|---|" + "---:|" * len(starts)]
    for name, *_ in BREAKDOWN:
        cells = []
        for _, start in starts:
            found = [b["s"] for b in start.get("breakdown_s") or [] if b["segment"] == name]
            cells.append(f"{found[0]:.2f}" if found else "")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    rows.append("| **launch → /health** | " + " | ".join(f"**{s.get('ready_s')}**" for _, s in starts) + " |")
    return "\n".join(rows)


def top_summary(models: dict[str, Any], targets: dict[str, float]) -> dict[str, Any]:
    """The result's ``summary``: per model, the start-up ratio against its target and what
    compiled at and after each start."""
    keys = (
        "files_added_at_warm_start_by_dir",
        "autotune_rebenchmarked_at_warm_start",
        "files_added_after_ready",
        "files_added_after_ready_cold",
        "files_added_after_ready_by_dir",
        "compile_lines_after_ready",
        "compile_lines_after_ready_cold",
        "requests_after_ready",
        "compile_wall_s",
        "compile_carried",
        "weights_mode",
        "compile_peak_gpu_bytes",
        "loaded_first_launches_after_ready",
        "failed",
    )
    out = {}
    for m, d in models.items():
        s = d["summary"]
        out[m] = {
            "ready_cold_s": s["ready_cold_s"],
            "ready_warm_s": s["ready_warm_s"],
            "speedup_ready": s["speedup_ready"],
            "target": targets.get(m),
            "met": (s["speedup_ready"] or 0) >= targets[m] if m in targets else None,
            "tokens_identical": s["tokens_identical"],
            "files_added_at_warm_start": s["files_added_at_warm_start"],
            **{k: s.get(k) for k in keys},
            "cold_from": d.get("cold_from"),
        }
        if "snapshot" in d:
            out[m].update(snapshot_flow.summary(d, m))
    return out


_COLD = ("serve_cold", "cold_generate")


def merge(out: Path, inputs: list[Path]) -> dict[str, Any]:
    """Several runs' results as one: every model's document (a later run's replaces an
    earlier one's), summarised again by this version's ``summary``; each model keeps the
    target and the command of its own run. A later run that left a model's cold start out
    (``--baked-only``, device time) takes the cold start of the latest earlier run of the
    same image key (the cold start uses no bundle, so a new bake does not change it), and
    says which in ``cold_from``; with another key it stays without one."""
    merged: dict[str, Any] = {"bench": "vllm_image_flow", "runs": [], "models": {}}
    targets: dict[str, float] = {}
    for path in inputs:
        run = json.loads(path.read_text())
        # Relative to the result, not the bare name: runs of several sessions share names
        # (moe-run.json) in their own folders.
        name = os.path.relpath(path.resolve(), out.resolve().parent)
        merged["runs"].append(
            {k: run.get(k) for k in ("command", "date", "wall_s", "skipped")} | {"file": name}
        )
        for m, d in run["models"].items():
            earlier = merged["models"].get(m)
            if "serve_cold" not in d and earlier and "serve_cold" in earlier:
                if earlier.get("key") == d.get("key"):
                    d.update({k: earlier[k] for k in _COLD if k in earlier})
                    d["cold_from"] = earlier.get("cold_from") or earlier.get("run")
                else:
                    d["cold_from"] = {"refused": "an earlier cold start of another image key"}
            d["run"] = {"file": name, "date": run.get("date")}
            d["summary"] = summary(d)
            merged["models"][m] = d
            target = (run.get("summary") or {}).get(m, {}).get("target")
            if target is not None:
                targets[m] = float(target)
    merged["method"] = run.get("method")
    merged["summary"] = top_summary(merged["models"], targets)
    out.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    return merged


def model_name(context: Path) -> str:
    """The model a rendered context is for: its folder's name (``SPEC-GPU``) less the GPU its
    target.json names, so that a run on an H100 and one on an H200 file the same model."""
    gpu = json.loads((context / "target.json").read_text())["gpu"]
    return context.resolve().parent.name.removesuffix(f"-{gpu}")


SRC = Path(__file__).resolve().parents[1] / "src"


def stale_wheel(context: Path, src: Path = SRC) -> list[str]:
    """The kernelbake modules whose text in the context's wheel (built when it was rendered)
    differs from this tree's, or that only one of them has: a context rendered before a change
    to the runtime runs the old code in its image (a device session spent on it is lost)."""
    wheels = sorted((context / "wheels").glob("kernelbake-*.whl"))
    if not wheels:
        return ["no kernelbake wheel in the context"]
    with zipfile.ZipFile(wheels[-1]) as whl:
        packed = {n: whl.read(n) for n in whl.namelist() if n.startswith("kernelbake/") and n.endswith(".py")}
    here = {
        p.relative_to(src).as_posix(): p.read_bytes()
        for p in (src / "kernelbake").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    return sorted(n for n in packed.keys() | here.keys() if packed.get(n) != here.get(n))


def main() -> int:
    if len(sys.argv) >= 4 and sys.argv[1] == "--merge":
        # Runs of one session that could not share a device call, as one result.
        merged = merge(Path(sys.argv[2]), [Path(p) for p in sys.argv[3:]])
        print(json.dumps(merged["summary"], indent=1, default=str))
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        # A committed run, summarised again by this version's summary() and table().
        result = json.loads(Path(sys.argv[2]).read_text())
        print(json.dumps({m: summary(d) for m, d in result["models"].items()}, indent=1, default=str))
        print(table(result))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--context", type=Path, action="append", required=True, help="one per model, run in order"
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--deadline", type=float, default=520.0, help="seconds for the whole run")
    ap.add_argument(
        "--also-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="for the first model: one more baked start after the first, with this variable set (A/B of a launch default)",
    )
    ap.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="MODEL=RATIO",
        help="the cold/warm launch->/health ratio a model must reach (reported, not enforced)",
    )
    ap.add_argument(
        "--serve-args",
        help="the user arguments of every start, one string (default: USER_ARGS, made for the GPU)",
    )
    ap.add_argument(
        "--serve-args-for",
        action="append",
        default=[],
        metavar="MODEL=ARGS",
        help="the user arguments of one model's starts, one string (instead of --serve-args)",
    )
    ap.add_argument(
        "--mix-total",
        type=int,
        default=200,
        help="requests of the mix (bench/request_mix.py) each start serves right after /health; 0: none",
    )
    ap.add_argument(
        "--min-left",
        type=float,
        default=240.0,
        help="seconds of --deadline a model after the first needs left to be started at all",
    )
    ap.add_argument(
        "--baked-only",
        action="append",
        default=[],
        metavar="MODEL",
        help="for this model: the compile and the baked start only, no cold start (device time)",
    )
    ap.add_argument(
        "--cold-first",
        action="append",
        default=[],
        metavar="MODEL",
        help="for a --snapshot model: its cold start before the snapshot's phases, not after",
    )
    ap.add_argument(
        "--save-caches",
        action="append",
        default=[],
        metavar="MODEL",
        help="for this model: its caches stage packed as OUT/MODEL/caches.tar.xz, for --caches-from",
    )
    ap.add_argument(
        "--caches-from",
        action="append",
        default=[],
        metavar="MODEL=TAR",
        help="for this model: the caches stage of an earlier run (--save-caches) on the same GPU "
        "model instead of the compile (device time: the FP8 MoE's compile is 8 to 11 minutes)",
    )
    ap.add_argument(
        "--skip-checks",
        action="store_true",
        help="leave out the kernelbake check runs after the starts (device time)",
    )
    ap.add_argument(
        "--rebake-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="for the first model, after the baked starts: the compile stage again with this "
        "variable set, and a baked start of that bundle with it (A/B of a compile factor)",
    )
    ap.add_argument(
        "--rebake-min-left",
        type=float,
        default=330.0,
        help="seconds of --deadline a --rebake-env needs left to be run at all",
    )
    ap.add_argument(
        "--snapshot",
        action="append",
        default=[],
        metavar="MODEL",
        help="after this model's baked start: its weights written, kernelbake snapshot take, restores "
        "through serve's gate, a key mismatch and the bad inputs (bench/snapshot_flow.py)",
    )
    ap.add_argument(
        "--weights-from",
        choices=snapshot_flow.WEIGHTS_FROM,
        default="auto",
        help="for --snapshot: the weight files a snapshot with the weights outside reloads: saved "
        "from the baked server and converted (bench/sharded_to_checkpoint.py), generated from the "
        "config (bench/fake_checkpoint.py; the restores are then compared with a start from them), "
        "or auto: saved where the converter knows the layout, generated where not",
    )
    ap.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="keep the model's files here (the model path a link to it), e.g. on /dev/shm where the "
        "disk cannot hold a generated checkpoint beside the snapshot",
    )
    ap.add_argument(
        "--snapshot-weights",
        choices=snapshot_flow.ASLEEP,
        default="outside",
        help="for --snapshot with weight files: how the restored engine gets its weights back: "
        "outside, vLLM's reload from the model's files; beside, the engine's weight memory saved "
        "in the snapshot and copied back (kernelbake snapshot take --weights beside)",
    )
    ap.add_argument(
        "--pages-probe",
        action="store_true",
        help="for --snapshot, after take: its CRIU page files read cold as they are, and packed "
        "(zlib, 4 MiB frames) then read cold and unpacked onto /dev/shm (bench/snapshot_pages.py)",
    )
    ap.add_argument(
        "--criu",
        default="/opt/kernelbake-criu/bin/criu",
        help="the CRIU wrapper images/base/criu/install.sh wrote (for --snapshot)",
    )
    ap.add_argument(
        "--importtime",
        action="store_true",
        help="for the first model: python -X importtime of each start's imports",
    )
    a = ap.parse_args()
    for context in a.context:
        if stale := stale_wheel(context):
            print(
                f"{context}: its kernelbake wheel is not this tree's ({len(stale)} modules differ: "
                f"{', '.join(stale[:3])}); render it again: kernelbake render SPEC --gpu GPU --out DIR",
                file=sys.stderr,
            )
            return 2
    if a.serve_args is not None:
        USER_ARGS[:] = shlex.split(a.serve_args)
    started = time.monotonic()
    targets = {m: float(r) for m, r in (t.split("=", 1) for t in a.target)}
    result: dict[str, Any] = {
        "bench": "vllm_image_flow",
        "command": "PYTHONPATH=/tmp/site python3 bench/vllm_image_flow.py "
        + " ".join(f"--context {c}" for c in a.context)
        + "".join(f" --also-env {e}" for e in a.also_env)
        + "".join(f" --target {t}" for t in a.target)
        + "".join(f" --serve-args-for {shlex.quote(x)}" for x in a.serve_args_for)
        + "".join(f" --baked-only {m}" for m in a.baked_only)
        + "".join(f" --cold-first {m}" for m in a.cold_first)
        + "".join(f" --save-caches {m}" for m in a.save_caches)
        + "".join(f" --caches-from {x}" for x in a.caches_from)
        + "".join(f" --rebake-env {e}" for e in a.rebake_env)
        + (" --skip-checks" if a.skip_checks else "")
        + f" --mix-total {a.mix_total}"
        + (" --importtime" if a.importtime else "")
        + "".join(f" --snapshot {m}" for m in a.snapshot)
        + (f" --model-dir {a.model_dir}" if a.model_dir else "")
        + (
            f" --weights-from {a.weights_from} --snapshot-weights {a.snapshot_weights} --criu {a.criu}"
            + (" --pages-probe" if a.pages_probe else "")
            if a.snapshot
            else ""
        )
        + f" --deadline {a.deadline:g} --out $OUT",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "method": "each model in turn: the rendered stages (compile alone), then a cold start "
        "(KERNELBAKE_CACHE=off) and a baked start of the final stage, each alone on the machine "
        "(a --snapshot model: the baked start, the snapshot's phases, then the cold start)",
        "models": {},
    }
    out_json = a.out / "vllm-image-flow.json"
    for i, context in enumerate(a.context):
        name = model_name(context)
        if i and a.deadline - (time.monotonic() - started) < a.min_left:
            # Too little time for a compile and a start: say so rather than run half of it.
            result.setdefault("skipped", []).append(f"{name}: {a.min_left:g} s or less left")
            out_json.write_text(json.dumps(result, indent=1, default=str) + "\n")
            continue
        doc = flow(context.resolve(), a.out / name, started, a, first=i == 0, name=name)
        result["models"][name] = doc
        result["summary"] = top_summary(result["models"], targets)
        if a.snapshot:
            result["snapshot_phases"] = snapshot_flow.phase_table(
                {m: d for m, d in result["models"].items() if "snapshot" in d}
            )
        result["wall_s"] = round(time.monotonic() - started, 1)
        # Written after each model: a run cut short keeps what it measured.
        out_json.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(json.dumps(result["summary"], indent=1, default=str))
    if result.get("snapshot_phases"):
        print(result["snapshot_phases"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
