"""What changes a vLLM cache and what does not: kernelbake's prediction vs what vLLM did.

    PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src python3 bench/vllm_keymatrix.py --out $OUT

On one GPU machine, in one run: the reference model (bench/specs/tiny-llama-ref.yaml) is
compiled once by ``kernelbake compile`` (compile-only, fake weights) into the image's cache
root. Then, for each case (a change of serve flags or environment), the bundle is restored
into a copy of its own, mounted at the cache root's path in a private mount namespace
(FlashInfer's cache embeds that path), and the case runs there:

1. ``kernelbake check --json --unsafe-size-only ARGS`` with the case's environment: the prediction;
2. ``kernelbake serve ARGS`` (vLLM's API server with dummy weights): vLLM's log evidence, the
   plugin's own prediction and the supervisor's self-check, and the files start-up added to
   each cache directory. It is stopped as soon as that is decided: vLLM said it compiles, or
   the server is up.

Cases run in parallel (16 cores, one GPU shared with a small memory budget each). Writes
OUT/vllm-RELEASE-GPU-keymatrix.json (RELEASE: the installed vLLM's, GPU: the card nvidia-smi
names, h100 or h200; {"cases": [{"name", "env", "args", "predicted",
"actual", "reasons", ...}]}) and OUT/keymatrix-logs.tar.gz. Values of secret-carrying
variables appear in neither (a case sets VLLM_API_KEY and the result is searched for it).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernelbake.runtime.engines.vllm.evidence import LogEvidence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))
from keymatrix_cases import EXPECTED, H200, cases  # noqa: E402 (bench/ is on the path from here)

SPEC = REPO / "bench/specs/tiny-llama-ref.yaml"
MODEL_CONFIG = REPO / "bench/models/tiny-llama-ref/config.json"
# Overridable only to exercise the orchestration off the GPU machine.
WORK = Path(os.environ.get("KEYMATRIX_WORK", "/opt/kernelbake-keymatrix"))
TARGET = Path(os.environ.get("KEYMATRIX_TARGET", "/opt/kernelbake/target.json"))
CACHE_ROOT = Path(os.environ.get("KEYMATRIX_CACHE_ROOT", "/opt/kernelbake/cache"))
# How long a start whose output ended may take to exit before it counts as still running.
EXIT_WAIT_S = 30.0


def _release() -> str:
    """The vLLM release this run measures, asked of the installed engine (its distribution's
    metadata), never assumed: the spec's release and the result's names follow it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return os.environ.get("KEYMATRIX_RELEASE") or version("vllm").split("+")[0]
    except PackageNotFoundError:
        return "0.26.0"  # off the GPU machine (the orchestration tests): the spec's own release


def _gpu() -> str:
    """The catalogue GPU this run bakes for: the one whose device name nvidia-smi reports (the
    name the catalogue keys by), never assumed: the device tool lends an H100 or an H200, and
    compile refuses a key planned for the other card (its compile hash names the exact device)."""
    from kernelbake.catalogue import load_catalogue

    if os.environ.get("KEYMATRIX_GPU"):
        return os.environ["KEYMATRIX_GPU"]
    try:
        names = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        names = []
    gpu = load_catalogue().gpu_by_device_name(names[0].strip()) if names else None
    return gpu.name if gpu is not None else "h200"  # off the GPU machine: the matrix's own card


RELEASE = _release()
GPU = _gpu()
RESULT = f"vllm-{RELEASE}-{GPU}-keymatrix.json"
IDENTITIES = f"vllm-{RELEASE}-{GPU}-identities.json"
# Cases whose identity document (as ``check --identity-out`` writes it) becomes a test fixture.
FIXTURE_CASES = {
    "baseline",
    "logging-debug",
    "api-key-secret",
    "max_model_len-underscore",
    "block-size-32",
    "max-num-seqs-512",
    "max-logprobs-5",
    # What the release's artifact load reads (0.26 compiled, 0.32 started warm), and what
    # vLLM refuses where it builds its compiler: the engine's own identities, for the tests.
    "inductor-fx-graph-cache-off",
    "inductor-force-disable-caches",
    "vllm-compile-cache-dir-elsewhere",
    "vllm-disable-compile-cache",
    "hashed-env-standalone-compile-off",
}
SECRET = "kb-secret-7f3a9c"
# Not hashed by vLLM (dummy weights, a fixed KV-cache size so parallel starts skip memory
# profiling, a port each); the same in every case, the baseline included.
BASE_ARGS = [
    "--load-format",
    "dummy",
    "--gpu-memory-utilization",
    "0.05",
    "--kv-cache-memory-bytes",
    "536870912",
]

# The cases, in the table both key matrices use (bench/keymatrix_cases.py).
CASES: list[dict[str, Any]] = cases(H200, secret=SECRET)


def _target_json(model_path: str | None = None) -> str:
    import dataclasses

    from kernelbake.contract.target import TargetConfig
    from kernelbake.plan import plan
    from kernelbake.spec import load_spec

    # The reference spec, at the release installed here (the spec names 0.26.0).
    spec = dataclasses.replace(load_spec(SPEC), engine_version=RELEASE)
    t = plan(spec, [GPU])[0]
    key = t.key if model_path is None else dataclasses.replace(t.key, model_path=model_path)
    return TargetConfig(key=key, gpu=GPU, serve=spec.serve, shapes=spec.compile.shapes).to_json()


def _base_env(home: Path, tmp: Path) -> dict[str, str]:
    keep = ("PATH", "PYTHONPATH", "LANG", "LD_LIBRARY_PATH", "CUDA_HOME", "PYTHONUNBUFFERED")
    env = {k: v for k, v in os.environ.items() if k in keep}
    home.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home), TMPDIR=str(tmp), KERNELBAKE_SCRATCH=str(tmp), KERNELBAKE_UNSAFE_TARGET=str(TARGET)
    )
    return env


def _shown(case: dict[str, Any]) -> dict[str, Any]:
    """The case's environment and arguments as they may be written down (secrets digested)."""
    from kernelbake.runtime import redact

    return {
        "env": redact.tree(case["env"]),
        "args": redact.Redactor.for_run({}, case["args"]).argv(case["args"]),
    }


def _plugin_site() -> Path:
    """kernelbake runs from source here, not pip-installed as in an image: its
    ``vllm.general_plugins`` entry point (pyproject.toml) must still be found by vLLM's
    processes, so a dist-info that declares only that entry point goes on PYTHONPATH."""
    site = WORK / "site"
    info = site / "kernelbake_bench_plugin-0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernelbake-bench-plugin\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nkernelbake = kernelbake.runtime.engines.vllm.plugin:register\n"
    )
    return site


def _shim() -> str:
    """The base image has vLLM's console script; a PYTHONPATH install has not."""
    shim = WORK / "bin"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "vllm").write_text(f'#!/bin/sh\nexec {sys.executable} -m vllm.entrypoints.cli.main "$@"\n')
    (shim / "vllm").chmod(0o755)
    return f"{shim}:{os.environ.get('PATH', '/usr/bin:/bin')}"


# -- inside one case's namespace --------------------------------------------------------


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_case(case: dict[str, Any], port: int, deadline: float) -> dict[str, Any]:
    from kernelbake.runtime.engines.vllm import VllmEngine
    from kernelbake.runtime.engines.vllm.evidence import cache_dirs

    name = case["name"]
    cdir = WORK / "cases" / name
    env = _base_env(cdir / "home", cdir / "tmp")
    env["KERNELBAKE_STATUS"] = str(cdir / "status.json")
    env.update(case["env"])
    if "model_path" in case:
        target = cdir / "target.json"
        target.write_text(_target_json(case["model_path"]))
        env["KERNELBAKE_UNSAFE_TARGET"] = str(target)
        # The runtime trusts the manifest only beside a pinned copy, as the image's final stage makes.
        from kernelbake.contract.layout import PINNED_MANIFEST_NAME

        shutil.copy(TARGET.parent / PINNED_MANIFEST_NAME, cdir / PINNED_MANIFEST_NAME)
    args = [*case["args"]]
    out: dict[str, Any] = {
        "name": name,
        **_shown(case),
        **_check(cdir, env, args, name in FIXTURE_CASES, deadline),
    }
    dirs = cache_dirs(CACHE_ROOT, VllmEngine.declaration.cache_kinds)
    for attempt in (1, 2):
        started = time.monotonic()
        decided, log, plugin_lines, wrong, with_files, again = _serve(cdir, env, port, args, dirs, deadline)
        out["serve_s"] = round(time.monotonic() - started, 1)
        text = (cdir / "serve.log").read_text(errors="replace")
        if decided in ("ready", "compiled", "load_failed", "flashinfer_build") or "EADDRINUSE" not in text:
            break
        # Twenty cases start at once, and torch.distributed's rendezvous port (a free one,
        # picked then bound) can be taken by another case in between: the engine exits.
        # That says nothing of the caches (it fails before any is opened); the case starts
        # once more, and its files are counted from a new snapshot.
        out["retried"] = f"attempt {attempt}: torch.distributed port taken by another case (EADDRINUSE)"
        (cdir / f"serve-attempt-{attempt}.log").write_text(text)
    files = {k: len(v) for k, v in with_files.items()}
    out["decided_by"] = decided
    out["log_evidence"] = log.to_json()
    out["files_added"] = files
    # Not a compile (evidence.split_rebenchmarked): named, and left out of the verdict.
    out["autotune_rebenchmarked"] = {k: len(v) for k, v in again.items() if v}
    out["plugin_prediction"] = plugin_lines[:12]
    out["prediction_wrong_lines"] = wrong
    compiled = decided in ("compiled", "load_failed", "flashinfer_build") or log.torch_compile_hit is False
    out["actual"] = _actual(decided, compiled, log.torch_compile_hit, files)
    out["actual_kinds"] = {k: ("miss" if n else "hit") for k, n in files.items()}
    if compiled:
        out["actual_kinds"]["vllm"] = "miss"
    status = cdir / "status.json"
    if status.is_file():
        out["serve_status"] = json.loads(status.read_text())
    return out


def _check(
    cdir: Path, env: dict[str, str], args: list[str], fixture: bool, deadline: float
) -> dict[str, Any]:
    """``kernelbake check --json`` of a case: what it predicted, why, and how long it took;
    ``fixture``: it also writes the engine's identity (``FIXTURE_CASES``)."""
    out: dict[str, Any] = {}
    started = time.monotonic()
    extra = ["--identity-out", str(cdir / "identity.json")] if fixture else []
    check = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelbake",
            "check",
            "--json",
            # The engine's own output on stderr, into this case's check.log.
            "-v",
            "--unsafe-size-only",
            *extra,
            *BASE_ARGS,
            *args,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=max(30.0, deadline - time.monotonic()),
    )
    (cdir / "check.log").write_text(check.stdout + "\n--- stderr\n" + check.stderr)
    out["check_s"] = round(time.monotonic() - started, 1)
    out["check_rc"] = check.returncode
    try:
        # The verdict is check's stdout; anything before it would be an engine's stray output.
        text = check.stdout
        verdict = json.loads(text[text.index("{") :] if "\n{" not in text else text[text.index("\n{") + 1 :])
        pred = verdict.get("prediction") or {}
        out["predicted"] = verdict["predicted"]
        out["reasons"] = list(verdict.get("problems", [])) + list(pred.get("reasons", []))
        out["prediction_source"] = pred.get("source")
        out["predicted_kinds"] = {k["kind"]: k["outcome"] for k in pred.get("kinds", [])}
    except (ValueError, KeyError):
        out["predicted"] = "error"
        out["reasons"] = [check.stderr.strip().splitlines()[-1] if check.stderr.strip() else "no output"]
    return out


def _actual(decided: str, compiled: bool, torch_compile_hit: bool | None, files: dict[str, int]) -> str:
    """What a start did, from how ``_serve`` saw it end."""
    if decided == "ready" or compiled:
        if compiled or any(files.values()):
            return "miss"
        # Up, nothing written, and vLLM neither loaded nor compiled a graph: it ran eagerly.
        return "no-compile" if torch_compile_hit is None else "hit"
    if decided.startswith("exited"):
        # The engine ended before it was ready and before it compiled (on 0.32 vLLM refused
        # VLLM_USE_STANDALONE_COMPILE=0 under its mega AOT artifact): decided, as a failure.
        return "failed"
    if any(files.values()):
        # Cut by the run's deadline while it wrote caches: it was building (the 0.32 H100 run's
        # uid-1000-root-owned-cache, 7 FlashInfer files into its own cache at the deadline).
        return "miss"
    return "undecided"


def _serve(
    cdir: Path, env: dict[str, str], port: int, args: list[str], dirs: dict[str, Path], deadline: float
) -> tuple[str, LogEvidence, list[str], list[str], dict[str, set[str]], dict[str, set[str]]]:
    """One ``kernelbake serve`` of a case until it is ready, compiles or ends: how it ended,
    vLLM's log evidence, the plugin's and the self-check's lines, and the files it added."""
    from kernelbake.runtime.engines.vllm.evidence import LogEvidence, Signal, snapshot

    before = snapshot(dirs)
    log = LogEvidence()
    serve_log = (cdir / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelbake", "serve", *BASE_ARGS, "--port", str(port), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    # The deadline's kill ends the output like an exit would; it is remembered so that the
    # start reads as cut off, not as an engine that exited -9 (the 0.32 H100 run called such a
    # start "failed", a wrong prediction).
    cut = threading.Event()
    timer = threading.Timer(max(1.0, deadline - time.monotonic()), lambda: (cut.set(), _kill(proc)))
    timer.start()
    decided = "timeout"
    plugin_lines: list[str] = []
    wrong: list[str] = []
    for line in proc.stdout:
        serve_log.write(line)
        signal_ = log.feed(line)
        if "kernelbake: prediction from" in line or "kernelbake:   " in line:
            plugin_lines.append(line.strip())
        if "prediction wrong" in line:
            wrong.append(line.strip())
        if signal_ in (Signal.COMPILED, Signal.LOAD_FAILED, Signal.FLASHINFER_BUILD):
            decided = signal_.value
            break
        if signal_ is Signal.READY:
            decided = "ready"
            # The supervisor's self-check follows READY: read on briefly.
            stop_at = time.monotonic() + 5
            for more in proc.stdout:
                serve_log.write(more)
                if "prediction wrong" in more:
                    wrong.append(more.strip())
                if "start-up compiled" in more or time.monotonic() > stop_at:
                    break
            break
        if time.monotonic() > deadline or proc.poll() is not None:
            decided = "timeout" if proc.poll() is None else f"exited {proc.returncode}"
            break
    if decided == "timeout":
        # Its output ends a moment before the process does: a start that exited is waited
        # for, not called a timeout (the 0.32 run's hashed-env-standalone-compile-off exited
        # at 24 s of a 900 s deadline and was left undecided).
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, min(EXIT_WAIT_S, deadline - time.monotonic())))
        if proc.poll() is not None and not cut.is_set():
            decided = f"exited {proc.returncode}"
    with_files, again = _start_added(cdir, dirs, before)
    timer.cancel()
    _kill(proc)
    proc.wait()
    serve_log.close()
    return decided, log, plugin_lines, wrong, with_files, again


def _start_added(
    cdir: Path, dirs: dict[str, Path], before: dict[str, dict[str, tuple[int, int]]]
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """What the start added to the caches it used, and the baked autotune results it
    benchmarked again (``split_rebenchmarked``). A file rewritten with the bytes the
    manifest records compiled nothing (vLLM rewrites lock files at every start); one
    rewritten with other bytes did. Where ``serve`` found the cache root read-only (the
    uid-1000 case) it started on a copy of it (``preflight.cache_root`` in its status): that
    copy began as exactly the manifest's files, so every file in it is checked against it."""
    from kernelbake.runtime.engines.vllm import VllmEngine
    from kernelbake.runtime.engines.vllm.evidence import cache_dirs, changes, manifest_digests, snapshot

    try:
        used = Path(json.loads((cdir / "status.json").read_text())["preflight"]["cache_root"])
    except (OSError, ValueError, KeyError, TypeError):
        used = CACHE_ROOT
    if used == CACHE_ROOT or not used.is_dir():
        return changes(before, snapshot(dirs), dirs, manifest_digests(CACHE_ROOT, dirs))
    copy = cache_dirs(used, VllmEngine.declaration.cache_kinds)
    baked = manifest_digests(used, copy)
    as_copied = {name: dict.fromkeys(paths, (-1, -1)) for name, paths in baked.items()}
    return changes(as_copied, snapshot(copy), copy, baked)


# -- orchestration ------------------------------------------------------------------------


def prepare(out: Path) -> dict[str, Any]:
    if WORK.exists():
        shutil.rmtree(WORK)
    (WORK / "cases").mkdir(parents=True)
    model = Path("/models/tiny-llama-ref")
    for p in (model, Path("/models/tiny-llama-moved")):
        p.mkdir(parents=True, exist_ok=True)
        shutil.copy(MODEL_CONFIG, p / "config.json")
    TARGET.parent.mkdir(parents=True, exist_ok=True)
    TARGET.write_text(_target_json())
    if CACHE_ROOT.exists():
        shutil.rmtree(CACHE_ROOT)
    CACHE_ROOT.mkdir(parents=True)
    _plugin_site()
    env = _base_env(WORK / "compile-home", WORK / "compile-tmp")
    env["PATH"] = _shim()
    started = time.monotonic()
    with (WORK / "compile.log").open("w") as fh:
        rc = subprocess.run(
            [sys.executable, "-m", "kernelbake", "compile"], env=env, stdout=fh, stderr=subprocess.STDOUT
        ).returncode
    info: dict[str, Any] = {"compile_rc": rc, "compile_s": round(time.monotonic() - started, 1)}
    if rc == 0:
        # What the image's final stage does: the manifest's pinned copy beside target.json.
        from kernelbake.contract.layout import PINNED_MANIFEST_NAME

        shutil.copy(CACHE_ROOT / "manifest.json", TARGET.parent / PINNED_MANIFEST_NAME)
        shutil.copytree(CACHE_ROOT, WORK / "pristine", symlinks=True)
        manifest = json.loads((CACHE_ROOT / "manifest.json").read_text())
        info["kinds"] = manifest.get("kinds")
        ident = manifest.get("compile_report", {}).get("engine_identity", {})
        info["identity_dirs"] = ident.get("dirs")
        info["pins"] = ident.get("pins")
    return info


def launch(case: dict[str, Any], index: int, deadline: float) -> dict[str, Any]:
    """One case in its own mount (and, if asked, UTS) namespace with its own bundle copy."""
    cdir = WORK / "cases" / case["name"]
    if time.monotonic() > deadline - 100:
        return {"name": case["name"], **_shown(case), "predicted": "not run", "actual": "not run"}
    shutil.rmtree(cdir, ignore_errors=True)
    shutil.copytree(WORK / "pristine", cdir / "cache", symlinks=True)
    cdir.mkdir(parents=True, exist_ok=True)
    inner = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--case",
        case["name"],
        "--port",
        str(8100 + index),
    ]
    inner += ["--deadline-at", str(deadline)]
    script = f"mount --bind {cdir / 'cache'} {CACHE_ROOT} && "
    if host := case.get("hostname"):
        script += f"hostname {host} && "
    prefix: list[str] = []
    if cpus := case.get("cpus"):
        prefix = ["taskset", "-c", f"0-{cpus - 1}"]
    if uid := case.get("uid"):
        # The bundle copy stays root-owned; the case's home, scratch and result are the user's.
        for path in [cdir, *(p for p in cdir.iterdir() if p.name != "cache")]:
            os.chown(path, uid, uid)
        prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *prefix]
    script += " ".join(shlex_quote(a) for a in [*prefix, *inner])
    flags = ["-m", "-u"] if case.get("hostname") else ["-m"]
    env = {**os.environ, "PATH": _shim()}
    proc = subprocess.run(
        ["unshare", *flags, "--propagation", "private", "sh", "-c", script],
        env=env,
        capture_output=True,
        text=True,
    )
    (cdir / "launcher.log").write_text(proc.stdout + "\n--- stderr\n" + proc.stderr)
    result_file = cdir / "result.json"
    if result_file.is_file():
        return dict(json.loads(result_file.read_text()))
    return {
        "name": case["name"],
        **_shown(case),
        "predicted": "error",
        "actual": "error",
        "reasons": [proc.stderr.strip()[-300:]],
    }


def shlex_quote(a: str) -> str:
    import shlex

    return shlex.quote(a)


def summarise(cases: list[dict[str, Any]]) -> dict[str, Any]:
    decided = [
        c
        for c in cases
        if c.get("predicted") in EXPECTED and c.get("actual") in ("hit", "miss", "no-compile", "failed")
    ]
    compiles = {"miss", "bypassed"}
    return {
        "cases": len(cases),
        "decided": len(decided),
        "right": sum(c["actual"] in EXPECTED[c["predicted"]] for c in decided),
        "wrong": [c["name"] for c in decided if c["actual"] not in EXPECTED[c["predicted"]]],
        "predicted_hit_missed": [
            c["name"] for c in decided if c["predicted"] not in compiles and c["actual"] == "miss"
        ],
        "predicted_miss_hit": [
            c["name"] for c in decided if c["predicted"] in compiles and c["actual"] != "miss"
        ],
        "undecided": [c["name"] for c in cases if c not in decided],
        "self_check_disagreed": [c["name"] for c in cases if c.get("prediction_wrong_lines")],
    }


def in_order(table: list[dict[str, Any]], only: list[str] | None) -> list[dict[str, Any]]:
    """The cases in the order they start. ``--only`` names them in order. Otherwise a case run
    as another uid starts first: it cannot use the baked FlashInfer modules and builds its own
    (over 6 minutes on the H100, 2026-12-05), and started last, as the table has it, the run's
    deadline cut it; the rest keep the table's order."""
    if only:
        by_name = {c["name"]: c for c in table}
        return [by_name[n] for n in only]
    return sorted(table, key=lambda c: c.get("uid") is None)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path)
    p.add_argument("--case")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--deadline", type=float, default=540, help="seconds from start for everything")
    p.add_argument("--deadline-at", type=float)
    p.add_argument("--parallel", type=int, default=15)
    p.add_argument("--only", nargs="*")
    p.add_argument("--reuse", action="store_true", help="keep the bundle a previous run compiled")
    a = p.parse_args()
    if a.case:
        case = next(c for c in CASES if c["name"] == a.case)
        result = run_case(case, a.port, a.deadline_at or time.monotonic() + 240)
        (WORK / "cases" / a.case / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))
        return 0
    assert a.out is not None
    t0 = time.monotonic()
    deadline = t0 + a.deadline
    a.out.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = f"{WORK / 'site'}:{os.environ.get('PYTHONPATH', '')}"
    if a.reuse and (WORK / "pristine" / "manifest.json").is_file():
        info = json.loads((WORK / "prepare.json").read_text())
        info["reused"] = True
    else:
        info = prepare(a.out)
        (WORK / "prepare.json").write_text(json.dumps(info))
    print(json.dumps({"prepare": info}), flush=True)
    cases = in_order(CASES, a.only)
    results: list[dict[str, Any]] = []
    if info.get("compile_rc") == 0:
        # Each case's result is written to OUT/cases/ as it ends: a run the device lease cuts
        # short still brings back the cases it finished.
        (a.out / "cases").mkdir(exist_ok=True)
        with concurrent.futures.ThreadPoolExecutor(a.parallel) as pool:
            futures = {pool.submit(launch, c, i, deadline): c for i, c in enumerate(cases)}
            for f in concurrent.futures.as_completed(futures):
                r = f.result()
                (a.out / "cases" / f"{futures[f]['name']}.json").write_text(json.dumps(r, sort_keys=True))
                print(
                    json.dumps({k: r.get(k) for k in ("name", "predicted", "actual", "decided_by")}),
                    flush=True,
                )
            results = [f.result() for f in futures]
    doc = {
        "command": "PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:src python3 bench/vllm_keymatrix.py --out $OUT",
        "release": RELEASE,
        "prepare": info,
        "base_args": BASE_ARGS,
        "summary": summarise(results),
        "wall_s": round(time.monotonic() - t0, 1),
        "cases": results,
    }
    identities: dict[str, Any] = {"baked": None, "cases": {}}
    if (WORK / "pristine" / "manifest.json").is_file():
        manifest = json.loads((WORK / "pristine" / "manifest.json").read_text())
        identities["baked"] = manifest.get("compile_report", {}).get("engine_identity")
        identities["kinds"] = sorted({f["kind"] for f in manifest.get("files", [])})
    for c in cases:
        ident_file = WORK / "cases" / c["name"] / "identity.json"
        if ident_file.is_file():
            identities["cases"][c["name"]] = {
                **_shown(c),
                "identity": json.loads(ident_file.read_text()),
            }
    (a.out / IDENTITIES).write_text(json.dumps(identities, indent=1, sort_keys=True) + "\n")
    text = json.dumps(doc, indent=1, sort_keys=True)
    doc["secret_in_result"] = SECRET in text
    doc["secret_in_identities"] = SECRET in (a.out / IDENTITIES).read_text()
    doc["secret_in_logs"] = [
        str(p.relative_to(WORK))
        for p in sorted(WORK.rglob("*.log"))
        if SECRET in p.read_text(errors="replace")
    ]
    (a.out / RESULT).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    with tarfile.open(a.out / "keymatrix-logs.tar.gz", "w:gz") as tar:
        for path in sorted(WORK.rglob("*.log")) + sorted(WORK.rglob("status.json")):
            tar.add(path, arcname=str(path.relative_to(WORK)))
    print(json.dumps(doc["summary"], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
