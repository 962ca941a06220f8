"""How long ``kernelbake serve`` holds vLLM back, old serve path against new (issue 14).

    git worktree add /tmp/kb-old 1423e67
    python3 bench/serve_launch_cpu.py --image 127.0.0.1:5000/kernelbake/tiny-llama@sha256:… \\
        --old-src /tmp/kb-old/src --new-src src --reps 7 --out bench/results/warmstart-cpu/serve-launch.json

Each start runs the image's ENTRYPOINT (``kernelbake serve``) in a fresh container, with one
kernelbake source tree or the other mounted ahead of the installed one on ``PYTHONPATH``.
A ``sitecustomize`` on the same path stamps the wall clock when the supervisor's interpreter
starts, and again when vLLM's API-server interpreter starts, then ends that one at once:
only the gap between the two is measured. The old path ran the whole preflight (torch's
import for the probe, the hashes) before it started vLLM. The new one starts vLLM after reading
``target.json`` and the manifest, and runs the preflight meanwhile. Old and new alternate, so
the machine's load falls on both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SITECUSTOMIZE = """\
import os, sys, time
marks = os.environ.get("KB_BENCH_MARKS")
if marks:
    argv = " ".join(getattr(sys, "orig_argv", []))
    if "kernelbake" in argv and "serve" in argv:
        with open(marks, "a") as fh:
            fh.write(f"supervisor {time.time()}\\n")
    elif "vllm.entrypoints" in argv or " serve " in argv:
        with open(marks, "a") as fh:
            fh.write(f"engine {time.time()}\\n")
        os._exit(0)
"""


def launch(image: str, src: Path, work: Path) -> dict[str, Any]:
    marks = work / "marks"
    marks.unlink(missing_ok=True)
    proc = subprocess.run(
        [
            "docker",
            "run",
            "--rm",
            "--shm-size",
            "1g",
            "-v",
            f"{work}:/kbbench",
            "-v",
            f"{src}:/kbsrc:ro",
            "-e",
            "PYTHONPATH=/kbsrc:/kbbench",
            "-e",
            "KB_BENCH_MARKS=/kbbench/marks",
            image,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    stamps = dict(line.split() for line in marks.read_text().splitlines()) if marks.exists() else {}
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("kernelbake serve:")]
    if "supervisor" not in stamps or "engine" not in stamps:
        raise SystemExit(f"no stamps from {src} (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {
        "launch_to_engine_s": round(float(stamps["engine"]) - float(stamps["supervisor"]), 3),
        "rc": proc.returncode,
        "preflight_line": next((ln for ln in lines if "preflight took" in ln), None),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True, help="a vLLM CPU image built by make image")
    ap.add_argument("--old-src", type=Path, required=True)
    ap.add_argument("--new-src", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kb-serve-launch-"))
    work.chmod(0o777)
    (work / "sitecustomize.py").write_text(SITECUSTOMIZE)
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for _ in range(a.reps):
        for name, src in (("old", a.old_src), ("new", a.new_src)):
            runs[name].append(launch(a.image, src.resolve(), work))
    doc: dict[str, Any] = {
        "bench": "serve_launch_cpu",
        "command": " ".join(["python3", *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "image": a.image,
        "measure": "wall clock from the supervisor's interpreter start to vLLM's interpreter start",
        **{
            f"{name}_launch_to_engine_s": {
                "median": round(statistics.median(r["launch_to_engine_s"] for r in rs), 3),
                "min": min(r["launch_to_engine_s"] for r in rs),
                "max": max(r["launch_to_engine_s"] for r in rs),
            }
            for name, rs in runs.items()
        },
        "runs": runs,
    }
    text = json.dumps(doc, indent=1) + "\n"
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
