"""The cache-only artifact against the full image: size, push time and pull time.

    python3 bench/cache_artifact.py --image REG/kb/tiny-llama@sha256:… \\
        --artifact REG/kb/tiny-llama@sha256:… --engine REG/engine/vllm-cpu@sha256:… \\
        --out bench/results/cache_artifact.json

The three references are pushed already (``kernelbake build --publish both`` after pushing the
engine image, as tests/integration/test_cache_artifact.py does). Sizes are what the registry
stores (compressed layers and config, from the manifests). Push: ``docker push`` of each to a
fresh registry of its own (every layer uploaded). Pull: ``podman pull`` into a fresh store of
its own for each of: the artifact alone, the full image alone, and the full image on a node
that already holds the engine image (what a node running the stock image pulls on top of it
when it switches to the full image). Each timing is repeated ``--repeat`` times; the JSON has
every run and the median.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)


def manifest(ref: str) -> dict[str, Any]:
    name, _, digest = ref.partition("@")
    host, _, repo = name.partition("/")
    req = urllib.request.Request(f"http://{host}/v2/{repo}/manifests/{digest}", headers={"Accept": ACCEPT})
    with urllib.request.urlopen(req, timeout=30) as r:
        doc: dict[str, Any] = json.loads(r.read())
    return doc


def layers(ref: str) -> dict[str, int]:
    m = manifest(ref)
    out = {d["digest"]: int(d["size"]) for d in m["layers"]}
    out[m["config"]["digest"]] = int(m["config"]["size"])
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def fresh_registry(root: Path) -> Iterator[str]:
    port = free_port()
    root.mkdir(parents=True)
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nlog: {{level: warn}}\nstorage: {{filesystem: {{rootdirectory: {root / 'data'}}}}}\n"
        f"http: {{addr: '127.0.0.1:{port}', secret: bench}}\n"
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait()


def run(*argv: str) -> float:
    start = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    return time.monotonic() - start


def push_seconds(ref: str, work: Path, name: str) -> float:
    """``docker push`` of ``ref`` (in Docker's store) to an empty registry."""
    with fresh_registry(work / f"reg-{name}-{time.monotonic_ns()}") as addr:
        target = f"{addr}/bench/{name}:x"
        subprocess.run(["docker", "pull", ref], check=True, capture_output=True)
        subprocess.run(["docker", "tag", ref, target], check=True)
        try:
            return run("docker", "push", target)
        finally:
            subprocess.run(["docker", "rmi", target], capture_output=True)


def pull_seconds(refs: list[str], work: Path, timed: str) -> float:
    """``podman pull`` of ``timed`` into a fresh store that already holds ``refs``."""
    # Podman refuses a runroot path longer than 50 characters.
    store = Path(tempfile.mkdtemp(dir="/tmp", prefix="kbp"))
    flags = ["--root", str(store / "root"), "--runroot", str(store / "run"), "--storage-driver", "overlay"]
    try:
        for ref in refs:
            subprocess.run(
                ["podman", *flags, "pull", "-q", "--tls-verify=false", ref], check=True, capture_output=True
            )
        return run("podman", *flags, "pull", "-q", "--tls-verify=false", timed)
    finally:
        subprocess.run(["podman", *flags, "system", "reset", "-f"], capture_output=True)
        shutil.rmtree(store, ignore_errors=True)


def timed(repeat: int, call: Any) -> dict[str, Any]:
    runs = [round(call(), 2) for _ in range(repeat)]
    return {"runs_s": runs, "median_s": statistics.median(runs)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", required=True)
    p.add_argument("--artifact", required=True)
    p.add_argument("--engine", required=True)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    image, artifact, engine = layers(args.image), layers(args.artifact), layers(args.engine)
    on_top = {d: s for d, s in image.items() if d not in engine}
    doc: dict[str, Any] = {
        "what": "tiny-llama on vLLM 0.32.0 CPU: cache-only artifact vs full kernelbake image",
        "refs": {"image": args.image, "artifact": args.artifact, "engine": args.engine},
        "bytes": {
            "artifact": sum(artifact.values()),
            "image": sum(image.values()),
            "engine": sum(engine.values()),
            "image_layers_not_in_engine": sum(on_top.values()),
        },
        "layers": {"artifact": len(artifact) - 1, "image": len(image) - 1},
        "cpus": os.cpu_count(),
        "load_average_at_start": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory(prefix="kb-bench-artifact-") as tmp:
        work = Path(tmp)
        doc["pull"] = {
            "artifact": timed(args.repeat, lambda: pull_seconds([], work, args.artifact)),
            "image": timed(args.repeat, lambda: pull_seconds([], work, args.image)),
            "image_with_engine_present": timed(
                args.repeat, lambda: pull_seconds([args.engine], work, args.image)
            ),
        }
        doc["push"] = {
            "artifact": timed(args.repeat, lambda: push_seconds(args.artifact, work, "artifact")),
            "image": timed(args.repeat, lambda: push_seconds(args.image, work, "image")),
        }
    doc["load_average_at_end"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    json.dump(doc, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
