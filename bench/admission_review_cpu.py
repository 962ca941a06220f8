"""A warm admission review's own work, in process: no server, no TLS, no registry.

The four allowed shapes of ``bench/admission_load.py``'s mix (a pod and a deployment by tag, a pod
by digest, an update) go through decode, ``Admitter.review`` and encode, the images answered by
the unit tests' fake verifier (``tests/admission/fakes.py``), so what is counted is the webhook's
own Python and nothing a host's load moves:

- ``us_per_review``: wall time over ``--reviews`` (loose: the host's load shows in it);
- ``calls_per_review``: Python function calls a review (cProfile), exact for a tree;
- ``instructions_per_review`` (``--callgrind``): valgrind's count over two runs of different
  lengths, subtracted, so start-up cancels; the same to 0.1 % run to run.

Run it in a tree (its ``src`` first on PYTHONPATH) or another revision's
(``git archive REV | tar -x -C DIR``; run from DIR with ``--tree DIR``: the fake verifier and the
documents are that tree's own):

    PYTHONPATH=src .venv/bin/python bench/admission_review_cpu.py [--reviews 20000] [--callgrind]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


def _mix(tree: Path) -> Callable[[int], None]:
    """``run(n)``: n warm reviews of the mix through ``tree``'s admitter."""
    sys.path.insert(0, str(tree))
    from tests.admission import documents
    from tests.admission.fakes import REPO, FakeVerifier, make_admitter

    from kernelbake.admission.admit import Endpoint
    from kernelbake.plan import plan
    from kernelbake.spec import load_spec

    spec = load_spec(tree / "images" / "qwen3-0.6b.yaml")
    keys = {t.gpu.name: t.key for t in plan(spec, ["all"], registry="r")}
    verifier = FakeVerifier()
    tag = f"{REPO}:h100"
    pinned = f"{REPO}@{verifier.add(tag, keys['h100'])}"
    admitter = make_admitter(verifier)
    docs = [
        (Endpoint.MUTATE, documents.load("pod-create", tag)),
        (Endpoint.MUTATE, documents.load("deployment-create", tag)),
        (Endpoint.VALIDATE, documents.load("pod-create", pinned)),
        (Endpoint.MUTATE, documents.as_update(documents.load("pod-create", pinned), old_image=tag)),
    ]
    bodies = [(endpoint, json.dumps(doc).encode()) for endpoint, doc in docs]

    def run(n: int) -> None:
        for i in range(n):
            endpoint, body = bodies[i % len(bodies)]
            answer = admitter.review(json.loads(body), endpoint)
            json.dumps(answer)
            assert answer["response"]["allowed"] is True, answer

    run(len(bodies))  # caches filled: the verifier's answers, the judge's, imports
    return run


def _instructions(tree: Path, n: int) -> int:
    """Instructions of a whole run of ``n`` reviews (valgrind's total)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={tmp}/cg.out",
                sys.executable,
                str(HERE),
                "--tree",
                str(tree),
                "--reviews",
                str(n),
                "--only-run",
            ],
            capture_output=True,
            text=True,
            check=True,
            env=os.environ,
        )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"admission_review_cpu: no count from valgrind:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, default=HERE.parents[1], help="the checkout whose tests/ to use")
    p.add_argument("--reviews", type=int, default=20_000)
    p.add_argument("--callgrind", action="store_true", help="also count instructions (valgrind, ~1 min)")
    p.add_argument("--only-run", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    run = _mix(a.tree.resolve())
    if a.only_run:
        run(a.reviews)
        return 0
    started = time.perf_counter()
    run(a.reviews)
    wall = time.perf_counter() - started
    profile = cProfile.Profile()
    profile.runcall(run, a.reviews)
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    result: dict[str, Any] = {
        "bench": "admission_review_cpu",
        "tree": str(a.tree),
        "reviews": a.reviews,
        "us_per_review": round(wall / a.reviews * 1e6, 1),
        "calls_per_review": round(calls / a.reviews, 1),
        "loadavg_1": round(os.getloadavg()[0], 2),
    }
    if a.callgrind:
        short, long = 400, 1400
        result["instructions_per_review"] = (_instructions(a.tree, long) - _instructions(a.tree, short)) // (
            long - short
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
