"""What ``kernelbake verify`` and ``kernelbake admission review`` do against a registry that
fails, and how long they take: each fault of tests/support/faults.py in front of a local Debian
docker-registry holding a signed kernelbake image, asked for by digest.

For each fault and each command: the exit code, the one line the user sees, and the elapsed
time (worst of ``--runs``) against the bound (``--deadline``: verify's ``--timeout``, the
admission policy's ``deadline_seconds``). Both run in this process, so the times are the
commands' own, without interpreter start-up. Prints JSON and writes bench/results/faults.json.

    .venv/bin/python bench/faults.py [--deadline 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.admission import documents, live  # noqa: E402
from tests.support.faults import Fault, fault_rule, proxy  # noqa: E402
from tests.support.registry import running_registry  # noqa: E402

from kernelbake import __version__  # noqa: E402
from kernelbake.cli import main as kernelbake  # noqa: E402
from kernelbake.oci import RegistryClient  # noqa: E402
from kernelbake.settings import Settings  # noqa: E402
from kernelbake.signing.keys import generate_key_pair, load_private_key  # noqa: E402
from kernelbake.signing.sign import sign_image  # noqa: E402
from kernelbake.signing.signer import KeySigner  # noqa: E402

RESULTS = REPO / "bench" / "results" / "faults.json"
REPOSITORY = "kernelbake/qwen3-0.6b"


def _run(argv: list[str]) -> tuple[int, str, float]:
    """(exit code, last line of stderr, seconds) of one in-process CLI call."""
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = kernelbake(argv)
    elapsed = time.monotonic() - started
    lines = err.getvalue().strip().splitlines()
    if lines:
        return rc, lines[-1], elapsed
    text = out.getvalue().strip()
    # verify prints "verified …"; admission review prints the AdmissionReview.
    return rc, "allowed" if text.startswith("{") else text.splitlines()[0], elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deadline", type=float, default=2.0, help="seconds (default 2)")
    parser.add_argument("--runs", type=int, default=3, help="runs per fault and command (default 3)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kb-bench-faults-"))
    os.environ["DOCKER_CONFIG"] = str(work / "docker-config")
    rows: list[dict[str, Any]] = []
    with running_registry(work / "registry") as registry:
        client = RegistryClient(Settings.from_env(), timeout=30)
        private, public = generate_key_pair(work / "keys", name="trusted")
        image = live.push_target(registry, REPOSITORY, "h100", "h100", work / "h100")
        sign_image(image.tagged, KeySigner(load_private_key(private)), client=client)
        impostor = live.push_target(registry, REPOSITORY, "impostor", "h100", work / "impostor")
        substitute = client.get_manifest(impostor.ref.with_digest(impostor.digest)).data

        for fault in [None, *Fault]:
            rule = fault_rule(fault, substitute=substitute) if fault else (lambda m, p: None)
            for command in ("verify", "admission review"):
                runs: list[tuple[int, str, float]] = []
                for _ in range(args.runs):
                    with proxy(registry, rule) as p:
                        pinned = f"{p.address}/{REPOSITORY}@{image.digest}"
                        if command == "verify":
                            argv = ["verify", pinned, "--key", str(public), "--timeout", str(args.deadline)]
                        else:
                            policy = live.write_policy(
                                work / "policy.yaml",
                                [f"{p.address}/kernelbake/**"],
                                public,
                                deadline_seconds=args.deadline,
                            )
                            request = work / "request.json"
                            request.write_text(json.dumps(documents.load("pod-create", pinned)))
                            argv = ["admission", "review", "--policy", str(policy), str(request)]
                        rc, line, elapsed = _run(argv)
                        runs.append(
                            (rc, line.replace(p.address, "PROXY").replace(image.digest, "DIGEST"), elapsed)
                        )
                rows.append(
                    {
                        "fault": fault.value if fault else "none",
                        "command": command,
                        "exit_code": runs[-1][0],
                        "message": runs[-1][1],
                        "bound_s": args.deadline,
                        "elapsed_s_max": round(max(r[2] for r in runs), 3),
                        "elapsed_s": [round(r[2], 3) for r in runs],
                        "over_bound_s": round(max(0.0, max(r[2] for r in runs) - args.deadline), 3),
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr)

    doc = {
        "benchmark": "faults",
        "what": "kernelbake verify and admission review (in-process) through a fault proxy in front of "
        "a local docker-registry, the signed image asked for by digest; drips send one byte every 0.25 s",
        "deadline_s": args.deadline,
        "runs": args.runs,
        "kernelbake": __version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
