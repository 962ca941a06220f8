"""vLLM cold start vs a start from a kernelbake bundle, on one GPU machine, in one run.

    PYTHONPATH=/tmp/site:src python3 bench/vllm_coldstart.py --out DIR [--deadline 480] [--tp N]
    python3 bench/vllm_coldstart.py --tp 4 --dry-run      # the plan, without a GPU or vLLM

For each model (the reference tiny Llama and the Qwen3-8B config, dummy weights):
  cold      a start with every cache directory empty;
  compile   kernelbake's compile-only run (fake weights) into a bundle, through the same
            code the image build stage runs (plan → TargetConfig → VllmEngine.compile →
            manifest);
  baked     a start from that bundle, at the paths it was built at (as an image keeps them);
  tc_only   a start with only the torch.compile part of the bundle (copied elsewhere: it
            is relocatable), for comparison.
Each run is its own process, with its own HOME and cache directories. Runs are spread over
four lanes, each with a quarter of the CPU cores (sched_setaffinity), and share the GPUs; the
schedule is in the result, so the concurrency behind every number is on record.

With ``--tp N`` (a machine with N GPUs) every run is at tensor parallel size N: vLLM starts one
worker per GPU, compile-only bakes every rank's caches, the compile report carries each rank's
peak and held GPU memory (each worker measures its own), and the limits apply per rank.

"Start" is the LLMEngine construction time, as ``vllm serve`` configures it (same parser and
usage context), with --load-format dummy and a fixed KV-cache size (vLLM then skips memory
profiling, which other processes on the same GPU would disturb; neither setting enters
vLLM's compile hash). Every run then generates 16 greedy tokens from a fixed prompt.

Writes DIR/vllm-0.26.0-h200.json (at --tp N: DIR/vllm-0.26.0-h200xN-tpN.json), DIR/logs.tar.gz,
and prints the summary JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
sys.path.insert(0, str(SRC))

MODELS = {
    "tiny-llama-ref": REPO / "bench/specs/tiny-llama-ref.yaml",
    "qwen3-8b-dummy": REPO / "bench/specs/qwen3-8b-dummy.yaml",
}
WORK = Path("/opt/kernelbake-bench")
PROMPT = list(range(1, 17))
MAX_TOKENS = 16
SERVE_KV_BYTES = 2 << 30
SERVE_GPU_UTIL = 0.15
LANES = 4
TARGETS = {"tiny-llama-ref": 10.0, "qwen3-8b-dummy": 8.0}
# At TP > 1 the target is 8x for every model.
TP_TARGET = 8.0
PEAK_LIMIT = {"tiny-llama-ref": 1 << 30, "qwen3-8b-dummy": 2 << 30}
ALLOCATED_LIMIT = 64 << 20


def core_groups(cores: list[int], lanes: int = LANES) -> list[list[int]]:
    """The machine's cores in ``lanes`` equal groups (16 cores: 4 of 4, as before)."""
    size = max(1, len(cores) // lanes)
    return [cores[i * size : (i + 1) * size] for i in range(lanes)]


CORE_GROUPS = core_groups(sorted(os.sched_getaffinity(0)))


def result_name(tp: int) -> str:
    return "vllm-0.26.0-h200.json" if tp == 1 else f"vllm-0.26.0-h200x{tp}-tp{tp}.json"


def _target(model: str, tp: int = 1) -> Any:
    from kernelbake.contract.target import TargetConfig
    from kernelbake.plan import plan
    from kernelbake.spec import load_spec

    spec = load_spec(MODELS[model])
    if tp != 1:
        spec = dataclasses.replace(spec, serve=dataclasses.replace(spec.serve, tensor_parallel_size=tp))
    t = plan(spec, ["h200"])[0]
    return TargetConfig(key=t.key, gpu="h200", serve=spec.serve, shapes=spec.compile.shapes)


def _base(model: str, tp: int = 1) -> Path:
    return WORK / (model if tp == 1 else f"{model}-tp{tp}")


def _roots(model: str, tp: int = 1) -> dict[str, Path]:
    base = _base(model, tp)
    return {
        "cold": base / "cold" / "cache",
        "compile": base / "bundle" / "cache",
        "baked": base / "bundle" / "cache",
        "tc_only": base / "tc-only" / "cache",
    }


# -- lanes (each runs in its own process) ---------------------------------------------------


def lane_compile(model: str, out: Path, tp: int = 1) -> dict[str, Any]:
    from kernelbake.contract.compat import check
    from kernelbake.runtime.bundle import write_manifest
    from kernelbake.runtime.engines.vllm import VllmEngine

    target = _target(model, tp)
    root = _roots(model, tp)["compile"]
    engine = VllmEngine()
    platform = engine.probe()
    verdict = check(target.key, platform)
    started = time.monotonic()
    result = engine.compile(target, root)
    wall = time.monotonic() - started
    manifest = write_manifest(
        root,
        target.key,
        result.kinds,
        hashed_env=result.hashed_env,
        report={**result.report, "builder": {"device": platform.device, "driver": platform.driver}},
        ranks=result.ranks,
    )
    return {
        "wall_s": round(wall, 2),
        "report": dict(result.report),
        "caches": manifest.totals(),
        "rank_files": {str(r): t for r, t in manifest.rank_totals().items()},
        "key": str(target.key),
        "measured_key_reasons": [str(r) for r in verdict.reasons],
        "facts": platform.fields(),
    }


def lane_serve(model: str, kind: str, out: Path, tp: int = 1) -> dict[str, Any]:
    from kernelbake.contract.engines import VLLM
    from kernelbake.runtime.engines.vllm.args import serve_argv
    from kernelbake.runtime.engines.vllm.evidence import added, cache_dirs, snapshot

    target = _target(model, tp)
    root = _roots(model, tp)[kind]
    env = VLLM.cache_env(root)
    os.environ.update(env)
    dirs = cache_dirs(root, VLLM.cache_kinds)
    before = snapshot(dirs)
    t0 = time.monotonic()
    import torch  # noqa: F401
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.llm_engine import LLMEngine

    from kernelbake.runtime.engines.vllm.compat_layer import parse_serve_argv
    from vllm import SamplingParams

    t_import = time.monotonic() - t0
    args = parse_serve_argv(serve_argv(target.key.model_path, target.serve)[2:])
    args.load_format = "dummy"
    args.kv_cache_memory_bytes = SERVE_KV_BYTES
    args.gpu_memory_utilization = SERVE_GPU_UTIL
    args.seed = 0
    t1 = time.monotonic()
    engine = LLMEngine.from_engine_args(args, usage_context=UsageContext.OPENAI_API_SERVER)
    start_s = time.monotonic() - t1
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, detokenize=False, seed=0)
    t2 = time.monotonic()
    engine.add_request("bench-0", {"prompt_token_ids": PROMPT}, params)
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                tokens = list(output.outputs[0].token_ids)
    first_request_s = time.monotonic() - t2
    after = snapshot(dirs)
    new = added(before, after)
    engine.engine_core.shutdown()
    return {
        "start_s": round(start_s, 2),
        "import_s": round(t_import, 2),
        "first_request_s": round(first_request_s, 2),
        "tokens": tokens,
        "files_added": {k: len(v) for k, v in new.items()},
        "triton_kernels_added": sorted(
            {
                Path(p).name.rsplit(".", 1)[0]
                for p in new.get("triton", set())
                if p.endswith(".json") and not Path(p).name.startswith("__grp__")
            }
        ),
    }


# -- orchestration -------------------------------------------------------------------------


def _prepare(tp: int = 1) -> None:
    for model, spec in MODELS.items():
        src = spec.parent / "../models" / model / "config.json"
        dst = Path("/models") / model
        dst.mkdir(parents=True, exist_ok=True)
        shutil.copy(src.resolve(), dst / "config.json")
        base = _base(model, tp)
        if base.exists():
            shutil.rmtree(base)
        for kind, root in _roots(model, tp).items():
            if kind != "baked":
                root.mkdir(parents=True, exist_ok=True)


def _stray(home: Path) -> dict[str, int]:
    """Files a run left under its HOME, by top-level directory: caches kernelbake missed."""
    counts: dict[str, int] = {}
    if home.is_dir():
        for p in home.rglob("*"):
            if p.is_file():
                top = p.relative_to(home).parts[0]
                counts[top] = counts.get(top, 0) + 1
    return counts


def _copy_tc_only(model: str, tp: int = 1) -> None:
    roots = _roots(model, tp)
    src = roots["compile"] / "vllm"
    dst = roots["tc_only"] / "vllm"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, symlinks=True)


_TIMING = re.compile(
    r"(Model loading took [^\n]*|torch\.compile took [^\n]*|Directly load[^\n]*|Graph capturing finished in [^\n]*|"
    r"init engine \(profile, create kv cache, warmup model\) took [^\n]*|Compiling a graph for [^\n]*|"
    r"[Ll]oading JIT ops?[^\n]*|Building[^\n]*ninja[^\n]*|Dynamo bytecode transform time[^\n]*|"
    r"Compile and warming up[^\n]*|Capturing CUDA graphs[^\n]*|Warming up[^\n]*)"
)


def _log_facts(log: Path) -> dict[str, Any]:
    from kernelbake.runtime.engines.vllm.evidence import LogEvidence

    text = log.read_text(errors="replace") if log.exists() else ""
    ev = LogEvidence().feed_all(text.splitlines())
    timings = []
    for m in _TIMING.finditer(text):
        line = m.group(1).strip()
        if line not in timings:
            timings.append(line[:200])
    return {"evidence": ev.to_json(), "timeline": timings[:40]}


def jobs_for(kinds: set[str]) -> list[dict[str, Any]]:
    """Every run, in priority order (longest chains first), with what each waits for."""
    jobs: list[dict[str, Any]] = []
    for kind in ("compile", "cold", "baked", "tc_only"):
        for model in ("qwen3-8b-dummy", "tiny-llama-ref"):
            deps = [f"compile-{model}"] if kind in ("baked", "tc_only") else []
            jobs.append({"name": f"{kind}-{model}", "model": model, "kind": kind, "deps": deps})
    return [j for j in jobs if j["kind"] in kinds]


def lane_argv(job: dict[str, Any], result: Path, tp: int) -> list[str]:
    return [
        sys.executable,
        __file__,
        "--lane",
        job["kind"],
        "--model",
        job["model"],
        "--result",
        str(result),
        "--tp",
        str(tp),
    ]


def dry_run(out: Path, kinds: set[str], tp: int) -> dict[str, Any]:
    """What a run would do, from the same functions (no GPU, no vLLM): each model's key and
    ``vllm serve`` flags at this TP, the jobs, the lanes and where the result goes."""
    from kernelbake.runtime.engines.vllm.args import serve_argv

    models = {}
    for model in MODELS:
        t = _target(model, tp)
        models[model] = {
            "key": str(t.key),
            "serve_argv": serve_argv(t.key.model_path, t.serve)[2:],
            "roots": {k: str(v) for k, v in _roots(model, tp).items()},
        }
    logs = out / "logs"
    return {
        "tp": tp,
        "result": str(out / result_name(tp)),
        "models": models,
        "jobs": [{**j, "argv": lane_argv(j, logs / f"{j['name']}.json", tp)} for j in jobs_for(kinds)],
        "core_groups": CORE_GROUPS,
    }


def orchestrate(out: Path, deadline: float, kinds: set[str], tp: int = 1) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    _prepare(tp)
    t_start = time.monotonic()
    jobs = jobs_for(kinds)
    free = list(range(len(CORE_GROUPS)))
    running: dict[str, tuple[subprocess.Popen[bytes], int, Any]] = {}
    done: dict[str, dict[str, Any]] = {}
    while len(done) < len(jobs):
        now = time.monotonic() - t_start
        for name, (proc, group, fh) in list(running.items()):
            rc = proc.poll()
            killed = rc is None and now > deadline
            if killed:
                proc.kill()
                rc = proc.wait()
            if rc is None:
                continue
            fh.close()
            job = next(j for j in jobs if j["name"] == name)
            done[name] = _entry(job, rc, killed, now, group, logs, deadline, tp)
            if job["kind"] == "compile" and "error" not in done[name] and "tc_only" in kinds:
                # Before any start writes into the bundle.
                _copy_tc_only(job["model"], tp)
            free.append(group)
            del running[name]
        for job in jobs:
            if job["name"] in done or job["name"] in running or not free:
                continue
            why = _not_run(job, done, now, deadline)
            if why is not None:
                done[job["name"]] = why
            elif all(d in done for d in job["deps"]):
                group = free.pop(0)
                proc, fh = _launch(job, logs, tp, CORE_GROUPS[group])
                job["t0"] = round(now, 1)
                running[job["name"]] = (proc, group, fh)
        time.sleep(0.5)
    return {"wall_s": round(time.monotonic() - t_start, 1), "runs": done}


def _entry(
    job: dict[str, Any], rc: int, killed: bool, now: float, group: int, logs: Path, deadline: float, tp: int
) -> dict[str, Any]:
    """What a finished (or killed) job reports, with its times, cores and log facts."""
    name = job["name"]
    result_file = logs / f"{name}.json"
    if killed:
        entry: dict[str, Any] = {"error": f"killed at the bench deadline ({deadline:.0f}s)"}
    elif result_file.exists():
        entry = json.loads(result_file.read_text())
    else:
        entry = {"error": f"exit {rc} without a result"}
    entry.update(job_times={"start_s": job["t0"], "end_s": round(now, 1)}, cores=CORE_GROUPS[group])
    entry.update(_log_facts(logs / f"{name}.log"))
    entry["stray_files_in_home"] = _stray(_base(job["model"], tp) / f"home-{job['kind']}")
    return entry


def _not_run(
    job: dict[str, Any], done: dict[str, dict[str, Any]], now: float, deadline: float
) -> dict[str, Any] | None:
    """Why a job will not run: a dependency failed, or its turn came after the deadline."""
    if any(d in done and "error" in done[d] for d in job["deps"]):
        return {"error": "skipped: a dependency failed"}
    if all(d in done for d in job["deps"]) and now > deadline:
        return {"error": "not started before the bench deadline"}
    return None


def _launch(job: dict[str, Any], logs: Path, tp: int, cores: Any) -> tuple[subprocess.Popen[bytes], Any]:
    """Start the job's lane on ``cores``, with a HOME of its own; the process and its log."""
    home = _base(job["model"], tp) / f"home-{job['kind']}"
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HOME": str(home),
        "PYTHONPATH": f"{SRC}:{os.environ.get('PYTHONPATH', '')}",
        "PYTHONUNBUFFERED": "1",
    }
    fh = (logs / f"{job['name']}.log").open("wb")
    proc = subprocess.Popen(
        lane_argv(job, logs / f"{job['name']}.json", tp),
        stdout=fh,
        stderr=subprocess.STDOUT,
        env=env,
        preexec_fn=lambda c=cores: os.sched_setaffinity(0, c),
    )
    return proc, fh


def rank_summary(report: dict[str, Any], peak_limit: int) -> dict[str, dict[str, Any]]:
    """Each rank's compile peak (the larger of its torch.compile and warm-up peaks, measured by
    the worker itself) and what it held when its artifact was saved, against the limits, which
    hold per rank (every GPU must fit them, not their sum)."""
    out: dict[str, dict[str, Any]] = {}
    for rank, facts in sorted(report.get("ranks", {}).items(), key=lambda kv: int(kv[0])):
        peak = max(facts.get("peak_at_aot_save_bytes", 0), facts.get("peak_after_aot_save_bytes", 0))
        held = facts.get("allocated_at_aot_save_bytes")
        out[rank] = {
            "tp_rank": facts.get("tp_rank"),
            "pp_rank": facts.get("pp_rank"),
            "compile_peak_mib": round(peak / 2**20, 1),
            "held_at_aot_save_mib": round(held / 2**20, 1) if held is not None else None,
            "held_at_end_of_start_mib": round(facts.get("allocated_at_end_bytes", 0) / 2**20, 1),
            "peak_ok": 0 < peak <= peak_limit,
            "held_ok": held is not None and held <= ALLOCATED_LIMIT,
        }
    return out


def summarise(runs: dict[str, dict[str, Any]], tp: int = 1) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for model in MODELS:
        cold, comp, baked, tc = (
            runs.get(f"{k}-{model}", {}) for k in ("cold", "compile", "baked", "tc_only")
        )
        target = TARGETS[model] if tp == 1 else TP_TARGET
        s: dict[str, Any] = {
            "tensor_parallel_size": tp,
            "cold_start_s": cold.get("start_s"),
            "baked_start_s": baked.get("start_s"),
            "tc_only_start_s": tc.get("start_s"),
            "compile_wall_s": comp.get("wall_s"),
        }
        if cold.get("start_s") and baked.get("start_s"):
            s["speedup_baked"] = round(cold["start_s"] / baked["start_s"], 2)
            s["speedup_target"] = target
            s["speedup_ok"] = s["speedup_baked"] >= target
        if cold.get("start_s") and tc.get("start_s"):
            s["speedup_tc_only"] = round(cold["start_s"] / tc["start_s"], 2)
        rep = comp.get("report", {})
        if rep:
            peak = rep.get("peak_at_aot_save_bytes")
            s["compile_peak_torch_compile_mib"] = round(peak / 2**20, 1) if peak else None
            s["compile_allocated_at_aot_save_mib"] = round(
                rep.get("allocated_at_aot_save_bytes", 0) / 2**20, 1
            )
            after = rep.get("peak_after_aot_save_bytes", 0)
            s["compile_peak_warmup_mib"] = round(after / 2**20, 1)
            peak = max(peak or 0, after)
            s["compile_peak_whole_run_mib"] = round(peak / 2**20, 1)
            s["weights_mode"] = rep.get("weights_mode")
            s["compile_allocated_after_teardown_mib"] = round(rep.get("allocated_after_bytes", 0) / 2**20, 1)
            if rep.get("alive_after"):
                s["alive_after_teardown"] = rep["alive_after"]
            s["peak_ok"] = bool(peak) and peak <= PEAK_LIMIT[model]
            # "Once compilation is done": when vLLM has saved its compiled artifact.
            s["allocated_at_end_of_compile_ok"] = (
                rep.get("allocated_at_aot_save_bytes", 1 << 40) <= ALLOCATED_LIMIT
            )
            if rep.get("ranks"):
                ranks = rank_summary(rep, PEAK_LIMIT[model])
                s["ranks"] = ranks
                s["ranks_ok"] = len(ranks) == tp and all(
                    r["peak_ok"] and r["held_ok"] for r in ranks.values()
                )
        s["caches"] = comp.get("caches")
        if comp.get("rank_files") is not None:
            files = comp["rank_files"]
            s["rank_files"] = files
            s["every_rank_baked"] = sorted(files, key=int) == [str(r) for r in range(tp)] and all(
                t["files"] > 0 for t in files.values()
            )
        if cold.get("tokens") and baked.get("tokens"):
            s["tokens_identical"] = cold["tokens"] == baked["tokens"]
        s["import_vllm_s"] = {"cold": cold.get("import_s"), "baked": baked.get("import_s")}
        s["tc_only_torch_compile_hit"] = tc.get("evidence", {}).get("torch_compile_hit")
        s["baked_hits"] = {
            "torch_compile": baked.get("evidence", {}).get("torch_compile_hit"),
            "files_added_at_start": baked.get("files_added"),
            "triton_kernels_compiled_at_start": baked.get("triton_kernels_added"),
        }
        summary[model] = s
    return summary


def resummarise(results_json: Path, out: Path) -> int:
    """Re-derive log evidence and the summary from a result file and its unpacked logs
    (``logs/`` beside it), e.g. after a fix to the evidence patterns."""
    doc = json.loads(results_json.read_text())
    logs = results_json.parent / "logs"
    for name, entry in doc["runs"].items():
        if (logs / f"{name}.log").exists():
            entry.update(_log_facts(logs / f"{name}.log"))
    doc["summary"] = summarise(doc["runs"], int(doc.get("tp", 1)))
    doc["resummarised"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(json.dumps(doc["summary"], indent=1, default=str))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--deadline", type=float, default=480.0)
    ap.add_argument("--lane", choices=["compile", "cold", "baked", "tc_only"])
    ap.add_argument("--model", choices=sorted(MODELS))
    ap.add_argument("--result", type=Path)
    ap.add_argument("--runs", default="compile,cold,baked,tc_only", help="which kinds of run to make")
    ap.add_argument("--resummarise", type=Path, help="rebuild the result from an unpacked logs/ dir")
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel size (a machine with this many GPUs)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan; needs no GPU or vLLM")
    a = ap.parse_args()
    if a.tp < 1:
        ap.error(f"--tp must be 1 or more, got {a.tp}")
    if a.lane:
        try:
            result = (
                lane_compile(a.model, a.result, a.tp)
                if a.lane == "compile"
                else lane_serve(a.model, a.lane, a.result, a.tp)
            )
        except BaseException as exc:
            import traceback

            traceback.print_exc()
            result = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        a.result.write_text(json.dumps(result, indent=1, default=str))
        os._exit(0)
    if a.dry_run:
        print(json.dumps(dry_run(a.out or Path("$OUT"), set(a.runs.split(",")), a.tp), indent=1))
        return 0
    assert a.out is not None
    env_info = {}
    for cmd in (
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        ["nproc"],
    ):
        try:
            env_info[cmd[0]] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError as exc:
            env_info[cmd[0]] = str(exc)
    if a.resummarise:
        return resummarise(a.resummarise, a.out)
    gpus = [line for line in env_info["nvidia-smi"].splitlines() if line.strip()]
    if len(gpus) < a.tp:
        print(f"--tp {a.tp} needs {a.tp} GPUs; nvidia-smi lists {len(gpus)}", file=sys.stderr)
        return 2
    result = orchestrate(a.out, a.deadline, set(a.runs.split(",")), a.tp)
    tp_flag = f" --tp {a.tp}" if a.tp != 1 else ""
    doc = {
        "bench": "vllm_coldstart",
        "command": f"PYTHONPATH=/tmp/site:src python3 bench/vllm_coldstart.py --out $OUT{tp_flag}",
        "tp": a.tp,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": env_info,
        "method": __doc__,
        "summary": summarise(result["runs"], a.tp),
        **result,
    }
    (a.out / result_name(a.tp)).write_text(json.dumps(doc, indent=1, default=str))
    with tarfile.open(a.out / "logs.tar.gz", "w:gz") as tar:
        tar.add(a.out / "logs", arcname="logs")
    shutil.rmtree(a.out / "logs")
    print(json.dumps(doc["summary"], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
