"""Before any run on the device: the bundle bench/gpu-bundle.sh made is the one Python loads,
and it works on this GPU. Prints one JSON document; exits 1, naming each failure, unless

- torch, triton and vLLM import from the bundle's directory at bundle.json's versions (the
  device's own torch 2.11 in /opt/torch/.venv must not win);
- the NCCL torch loaded is the bundle's: the ``libnccl.so`` mapped into this process, asked for
  its version (``ncclGetVersion``); ``torch.cuda.nccl.version()`` is the version torch was
  built against (2.29.7 for 2.13.0), reported beside it;
- a float32 CUDA matmul equals the CPU's within float32 rounding, and a ``torch.compile``d
  function (Inductor generating a Triton kernel, Triton's ptxas building it) equals eager;
- every vLLM function the release's adapter hooks is where it expects (``compat_layer``).

What torch says of cuDNN and whether FlashInfer imports is reported, not judged: a text model
on Hopper calls neither at start (bench/gpu-bundle.sh, "What stays on the device").

    PYTHONPATH=/tmp/site:src python3 bench/gpu_bundle_check.py --bundle /root/stash/bundle.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any


def _under(module: Any, site: Path) -> bool:
    return Path(module.__file__).resolve().is_relative_to(site.resolve())


def _versions(want: dict[str, str], site: Path, doc: dict[str, Any], failures: list[str]) -> None:
    import torch
    import triton

    import vllm

    for name, module, version in (
        ("torch", torch, torch.__version__),
        ("triton", triton, triton.__version__),
        ("vllm", vllm, vllm.__version__),
    ):
        doc[name] = {"version": str(version), "file": str(module.__file__)}
        expected = want.get(name)
        if expected and str(version).split("+")[0] != expected:
            failures.append(f"{name} {version} imported, the bundle holds {expected}")
        if expected and not _under(module, site):
            failures.append(f"{name} imported from {module.__file__}, not from the bundle at {site}")


def _nccl(want: dict[str, str], doc: dict[str, Any], failures: list[str]) -> None:
    import ctypes

    import torch

    doc["nccl_built_against"] = ".".join(str(p) for p in torch.cuda.nccl.version())
    with Path("/proc/self/maps").open() as maps:
        mapped = sorted({line.split()[-1] for line in maps if "/libnccl.so" in line})
    doc["nccl_mapped"] = mapped
    if len(mapped) != 1:
        failures.append(f"expected one libnccl.so mapped into this process, found {mapped}")
        return
    code = ctypes.c_int()
    if ctypes.CDLL(mapped[0]).ncclGetVersion(ctypes.byref(code)) != 0:
        failures.append(f"ncclGetVersion failed in {mapped[0]}")
        return
    # NCCL's code since 2.9: major * 10000 + minor * 100 + patch.
    found = f"{code.value // 10000}.{code.value // 100 % 100}.{code.value % 100}"
    doc["nccl"] = found
    expected = want.get("nvidia-nccl-cu13")
    if expected and found != expected:
        failures.append(f"torch loaded NCCL {found} ({mapped[0]}), the bundle holds {expected}")


def _cudnn(doc: dict[str, Any]) -> None:
    import torch

    try:
        doc["cudnn"] = str(torch.backends.cudnn.version())
    except Exception as exc:  # torch's own compatibility verdict, reported as it says it
        doc["cudnn"] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def _compute(doc: dict[str, Any], failures: list[str]) -> None:
    import torch

    if not torch.cuda.is_available():
        failures.append("torch sees no CUDA device")
        return
    doc["device"] = torch.cuda.get_device_name()
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(512, 512, generator=gen)
    b = torch.randn(512, 512, generator=gen)
    on_gpu = (a.cuda() @ b.cuda()).cpu()
    err = float((on_gpu - a @ b).abs().max())
    doc["matmul_max_abs_err"] = err
    if not err < 1e-2:
        failures.append(f"CUDA matmul differs from the CPU's by {err}")

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2 + 1

    x = torch.randn(4096, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    compiled = torch.compile(f)(x)
    err = float((compiled - f(x)).abs().max())
    doc["compiled_max_abs_err"] = err
    if not err < 1e-5:
        failures.append(f"torch.compile's Triton kernel differs from eager by {err}")


def _flashinfer(doc: dict[str, Any]) -> None:
    try:
        import flashinfer

        doc["flashinfer"] = str(getattr(flashinfer, "__version__", "?"))
    except Exception as exc:
        doc["flashinfer"] = f"{type(exc).__name__}: {exc}"


def _hooks(doc: dict[str, Any], failures: list[str]) -> None:
    from kernelbake.runtime.engines.vllm import compat_layer

    adapter = compat_layer.patches_for_installed_vllm()
    problems = compat_layer.hook_problems(adapter.HOOKS)
    doc["adapter"] = {
        "module": getattr(adapter, "__name__", "?"),
        "hooks": len(adapter.HOOKS),
        "problems": problems,
    }
    failures += [f"hook {p}" for p in problems]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True, help="bundle.json of the installed bundle")
    ap.add_argument("--site", type=Path, default=Path("/tmp/site"))
    args = ap.parse_args(argv)
    manifest = json.loads(args.bundle.read_text())
    want = {"vllm": manifest["release"], **manifest.get("versions", {})}
    doc: dict[str, Any] = {"bundle": manifest}
    failures: list[str] = []
    # The compile step's caches go nowhere that a later run reads.
    scratch = tempfile.mkdtemp(prefix="bundle-check-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{scratch}/inductor"
    os.environ["TRITON_CACHE_DIR"] = f"{scratch}/triton"
    steps = (
        ("versions", lambda: _versions(want, args.site, doc, failures)),
        ("nccl", lambda: _nccl(want, doc, failures)),
        ("cudnn", lambda: _cudnn(doc)),
        ("compute", lambda: _compute(doc, failures)),
        ("flashinfer", lambda: _flashinfer(doc)),
        ("hooks", lambda: _hooks(doc, failures)),
    )
    for name, step in steps:
        try:
            step()
        except Exception as exc:
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            doc.setdefault("tracebacks", []).append(traceback.format_exc(limit=3))
    doc["failures"] = failures
    doc["ok"] = not failures
    print(json.dumps(doc, indent=1, sort_keys=True))
    if failures:
        print("gpu_bundle_check: FAILED: " + "; ".join(failures), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
