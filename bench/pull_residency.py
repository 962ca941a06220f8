"""After a pull, is a layer's content in the page cache? A snapshot restore with the page cache
dropped is the disk's time to read it (issue 40: the 8B 10.63 s against 4.25 s warm, the MoE 26.8
against 4.95 s); a node that has just pulled the snapshot's image volume may hold it in memory
anyway, since unpacking a layer writes its files through the page cache. Measured rather than
assumed: an image of one layer of random bytes is built, pushed, removed, the page cache dropped,
the image pulled again, and the pulled file's resident bytes counted (``fincore``, util-linux).

Needs root (drop_caches), Docker and a registry (``make deps`` starts one on 127.0.0.1:5000):

    python3 bench/pull_residency.py [--gb 2] [--registry 127.0.0.1:5000] [--out bench/results/pull_residency.json]

What it cannot say: how long the content stays resident (that depends on what else the node
reads), and containerd's own path (Kubernetes image volumes) beside Docker's; both unpack
through the page cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Its sibling script (bench/ is not a package).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot_pages import drop_caches


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def measure(gb: float, registry: str) -> dict[str, Any]:
    ref = f"{registry}/kernelbake-bench/pull-residency:{int(time.time())}"
    size = int(gb * 1e9)
    with tempfile.TemporaryDirectory(prefix="pull-residency-") as tmp:
        blob = Path(tmp) / "blob.bin"
        with blob.open("wb") as fh:
            left = size
            while left:
                chunk = os.urandom(min(left, 64 << 20))
                fh.write(chunk)
                left -= len(chunk)
        # Imported, not built: BuildKit's cache would keep the layer after the image is removed,
        # and the pull would then download nothing.
        _run("tar", "-C", tmp, "-cf", f"{tmp}/layer.tar", "blob.bin")
        blob.unlink()
        _run("docker", "import", f"{tmp}/layer.tar", ref)
    _run("docker", "push", "-q", ref)
    _run("docker", "rmi", "-f", ref)
    if not drop_caches():
        raise SystemExit("pull_residency: cannot drop the page cache: the pull would be measured warm")
    started = time.monotonic()
    said = _run("docker", "pull", ref)
    pull_s = time.monotonic() - started
    if "Pull complete" not in said:
        # The layer was still on this machine: nothing went through the page cache to measure.
        raise SystemExit(f"pull_residency: the pull of {ref} downloaded nothing:\n{said}")
    upper = _run("docker", "image", "inspect", ref, "--format", "{{.GraphDriver.Data.UpperDir}}").strip()
    res, fsize = _run("fincore", "-b", "-n", "-o", "RES,SIZE", f"{upper}/blob.bin").split()
    _run("docker", "rmi", "-f", ref)
    return {
        "bytes": size,
        "pull_s": round(pull_s, 2),
        "resident_bytes": int(res),
        "resident_share": round(int(res) / int(fsize), 4),
        "storage_driver": _run("docker", "info", "--format", "{{.Driver}}").strip(),
        "memory_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.0, help="the layer's size")
    ap.add_argument("--registry", default="127.0.0.1:5000")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("pull_residency: needs root, to drop the page cache before the pull", file=sys.stderr)
        return 2
    doc = {
        "command": "python3 bench/pull_residency.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        **measure(a.gb, a.registry),
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
