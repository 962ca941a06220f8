"""What checking a cache bundle against its manifest costs at start-up.

    python bench/cache_verify.py --bundle /tmp/bundle --label tiny-llama-cpu
    python bench/cache_verify.py --synthetic 376 35000000 --label h200-synthetic-376-files

``--bundle`` is a bundle root copied out of an image (``docker cp CONTAINER:/opt/kernelbake/cache DIR``);
``--synthetic FILES BYTES`` writes one of that shape (random bytes, the manifest written by
kernelbake's own ``write_manifest``). Measures, median of ``--runs``:

- sizes only (``KERNELBAKE_VERIFY=unsafe-size-only``);
- the sha256 of every file, as ``serve`` does it (thread pool), and on one thread;
- with ``--drop-caches`` (root on a machine of your own) the page cache is dropped before
  each hashing run, as after a fresh pull; whether that worked is recorded;
- when torch is importable: ``import torch`` in a fresh interpreter alone, and with the
  hashing running beside it in the same process, which is what ``serve``'s preflight does.

Results are merged into bench/results/cache_verify.json under ``--label``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The sibling scripts, also where this file is loaded as a module, not run.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot_pages import drop_caches

RESULTS = Path(__file__).resolve().parent / "results" / "cache_verify.json"
_SRC = Path(__file__).resolve().parents[1] / "src"


def _synthetic(root: Path, files: int, total: int) -> None:
    from kernelbake.contract.key import CacheKey, Engine
    from kernelbake.contract.layout import CacheKind, kind_dir
    from kernelbake.runtime.bundle import write_manifest

    sizes = [total // files + (1 if i < total % files else 0) for i in range(files)]
    for i, size in enumerate(sizes):
        path = kind_dir(root, CacheKind.TRITON) / f"k{i // 32:03d}" / f"kernel{i}.cubin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    # Any valid key: only the files are measured.
    ints = {"tp", "pp", "ep", "max_model_len", "max_num_batched_tokens"}
    fields: dict[str, Any] = {
        f.name: 1 if f.name in ints else "synthetic" for f in dataclasses.fields(CacheKey)
    }
    key = CacheKey(**{**fields, "engine": Engine.TORCH, "model_path": "/models/synthetic"})
    write_manifest(root, key, [CacheKind.TRITON])


def _timed(fn: Any, runs: int, drop: bool) -> tuple[float, list[float], bool]:
    times, dropped = [], True
    for _ in range(runs):
        if drop:
            dropped = drop_caches() and dropped
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), [round(t, 4) for t in times], drop and dropped


_IMPORT = """
import sys, time
from pathlib import Path
start = time.perf_counter()
check = None
if sys.argv[1] == "with-hashing":
    from kernelbake.runtime.bundle import read_manifest
    from kernelbake.runtime.integrity import Check
    root = Path(sys.argv[2])
    check = Check(root, read_manifest(root), hash_files=True)
import torch
imported = time.perf_counter() - start
problems = check.result() if check else []
assert problems == [], problems
print(imported, time.perf_counter() - start)
"""


def _import_torch(root: Path, runs: int, drop: bool) -> dict[str, Any] | None:
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, check=False)
    if probe.returncode != 0:
        return None
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_SRC), os.environ.get("PYTHONPATH")])),
    }
    walls: dict[str, list[float]] = {"alone": [], "with-hashing": []}
    # One import first, discarded (it fills the page cache with torch), then the two kinds
    # alternate so that a trend in the machine's load hits both alike.
    for i in range(runs + 1):
        for mode in walls:
            if drop:
                drop_caches()
            res = subprocess.run(
                [sys.executable, "-c", _IMPORT, mode, str(root)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            if i:
                walls[mode].append(float(res.stdout.split()[1]))
    return {
        f"import_torch_{mode.replace('-', '_')}_s": round(statistics.median(times), 4)
        for mode, times in walls.items()
    } | {
        f"import_torch_{mode.replace('-', '_')}_runs": [round(t, 3) for t in times]
        for mode, times in walls.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--bundle", type=Path)
    source.add_argument("--synthetic", nargs=2, type=int, metavar=("FILES", "BYTES"))
    parser.add_argument("--label", required=True)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--drop-caches", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sys.path.insert(0, str(_SRC))
    from kernelbake.runtime import integrity
    from kernelbake.runtime.bundle import read_manifest

    with tempfile.TemporaryDirectory() as tmp:
        root = args.bundle
        if root is None:
            root = Path(tmp) / "cache"
            _synthetic(root, *args.synthetic)
        manifest = read_manifest(root)

        def pooled() -> None:
            assert integrity.Check(root, manifest, hash_files=True).result() == []

        def one_thread() -> None:
            assert all(integrity._digest_problem(root, f) is None for f in manifest.files)

        def sizes() -> None:
            assert integrity.size_problems(root, manifest) == []

        size_s, size_runs, _ = _timed(sizes, args.runs, False)
        pool_s, pool_runs, dropped = _timed(pooled, args.runs, args.drop_caches)
        one_s, one_runs, _ = _timed(one_thread, args.runs, args.drop_caches)
        result: dict[str, Any] = {
            "files": len(manifest.files),
            "bytes": sum(f.size for f in manifest.files),
            "runs": args.runs,
            "page_cache_dropped": dropped,
            "size_only_s": round(size_s, 4),
            "sha256_pool_s": round(pool_s, 4),
            "sha256_one_thread_s": round(one_s, 4),
            "sha256_pool_runs": pool_runs,
            "sha256_one_thread_runs": one_runs,
            "size_only_runs": size_runs,
            "host": {
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            },
        }
        if (imports := _import_torch(root, max(3, args.runs // 2), args.drop_caches)) is not None:
            result.update(imports)
    doc = json.loads(args.out.read_text()) if args.out.exists() else {}
    doc[args.label] = result
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(json.dumps({args.label: result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
