"""How much ``/dev/shm`` vLLM's start needs, read from the vLLM installed here.

vLLM's multiprocess executor (``vllm/v1/executor/multiproc_executor.py``, 0.26 and 0.32) makes
one ``MessageQueue`` that broadcasts to its workers, of ``VLLM_MQ_MAX_CHUNK_BYTES_MB`` MiB
chunks, and each worker one of its own for its responses, ``MessageQueue(1, 1)`` with the
queue's default chunk size; each is a ring buffer of ``max_chunks`` chunks plus a flag byte per
reader and chunk, in ``/dev/shm``. vLLM 0.32 checks each alone as it creates it (0.26 does not
check); they are sparse files that fill as messages pass, so the preflight asks room for all
of them at once. The executor is the multiprocess one on vLLM's CPU build (its platform turns
``uni`` into ``mp`` unless ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and on a GPU when more than one
worker runs; a single GPU worker runs in the engine's own process and needs none.

Importing vLLM to ask takes seconds (~14 s on the CPU image) and this check is there to fail
in the first one, so the numbers are read from vLLM's installed source with ``ast``, without
running it; where that source is missing or its shape changed, the defaults of vLLM 0.26 and
0.32 below are used and the message says so.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path

from kernelbake.contract.serve import ServeArgs
from kernelbake.runtime.engines.vllm.args import flag_name
from kernelbake.runtime.shm import MIB, ShmNeed

CHUNK_MB_ENV = "VLLM_MQ_MAX_CHUNK_BYTES_MB"
# vLLM 0.26's and 0.32's own defaults: envs.VLLM_MQ_MAX_CHUNK_BYTES_MB, and MessageQueue's
# max_chunk_bytes and max_chunks.
FALLBACK_CHUNK_MB = 16
FALLBACK_QUEUE_CHUNK_BYTES = 24 * MIB
FALLBACK_QUEUE_CHUNKS = 10

ENVS = "envs.py"
SHM_BROADCAST = "distributed/device_communicators/shm_broadcast.py"


def vllm_root() -> Path | None:
    """The installed vllm package's directory, found without importing it."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _number(node: ast.expr) -> int:
    """An integer constant expression (``1024 * 1024 * 24``, ``1 << 22``); anything else raises."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp):
        left, right = _number(node.left), _number(node.right)
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.LShift):
            return left << right
    raise ValueError(f"not an integer constant: {ast.unparse(node)}")


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def queue_defaults(root: Path) -> tuple[int, int]:
    """``MessageQueue.__init__``'s defaults for ``max_chunk_bytes`` and ``max_chunks``."""
    for node in ast.walk(_parse(root / SHM_BROADCAST)):
        if isinstance(node, ast.ClassDef) and node.name == "MessageQueue":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                    args = fn.args.args[len(fn.args.args) - len(fn.args.defaults) :]
                    defaults = {
                        a.arg: _number(d) for a, d in zip(args, fn.args.defaults, strict=True) if _is_int(d)
                    }
                    return defaults["max_chunk_bytes"], defaults["max_chunks"]
    raise ValueError("no MessageQueue.__init__")


def _is_int(node: ast.expr) -> bool:
    try:
        _number(node)
    except ValueError:
        return False
    return True


def chunk_mb_default(root: Path) -> int:
    """``envs.VLLM_MQ_MAX_CHUNK_BYTES_MB``'s default (its typed declaration in ``envs.py``)."""
    for node in ast.walk(_parse(root / ENVS)):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == CHUNK_MB_ENV
            and node.value is not None
        ):
            return _number(node.value)
    raise ValueError(f"no {CHUNK_MB_ENV} in {ENVS}")


def _last_value(user_args: Sequence[str], names: tuple[str, ...]) -> str | None:
    """The value of the last of ``names`` in ``user_args`` (``--flag V`` or ``--flag=V``)."""
    value = None
    for i, arg in enumerate(user_args):
        if flag_name(arg) not in names:
            continue
        if "=" in arg:
            value = arg.split("=", 1)[1]
        elif i + 1 < len(user_args):
            value = user_args[i + 1]
    return value


def _size(user_args: Sequence[str], names: tuple[str, ...], baked: int) -> int:
    value = _last_value(user_args, names)
    try:
        return int(value) if value is not None else baked
    except ValueError:
        return baked  # vLLM's parser refuses it, with its own message


def shm_need(
    serve: ServeArgs,
    user_args: Sequence[str],
    environ: Mapping[str, str],
    *,
    cpu_build: bool,
    root: Path | None,
) -> ShmNeed | None:
    """What vLLM, started with these arguments and this environment, puts in ``/dev/shm``;
    ``None`` when its executor puts nothing there."""
    workers = _size(user_args, ("--tensor-parallel-size", "-tp"), serve.tensor_parallel_size) * _size(
        user_args, ("--pipeline-parallel-size", "-pp"), serve.pipeline_parallel_size
    )
    replicas = _size(user_args, ("--data-parallel-size", "-dp"), 1)
    backend = _last_value(user_args, ("--distributed-executor-backend",))
    if backend is None:
        multiprocess = cpu_build and environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "1"
        backend = "mp" if workers > 1 or multiprocess else "uni"
    if backend != "mp":
        return None
    source = "read from the installed vLLM's source"
    try:
        if root is None:
            raise ValueError("vllm is not installed")
        queue_chunk, chunks = queue_defaults(root)
        chunk_mb = chunk_mb_default(root)
    except (OSError, ValueError, KeyError, SyntaxError) as exc:
        queue_chunk, chunks, chunk_mb = FALLBACK_QUEUE_CHUNK_BYTES, FALLBACK_QUEUE_CHUNKS, FALLBACK_CHUNK_MB
        source = f"vLLM 0.26's and 0.32's defaults; the installed vLLM could not be read: {exc}"
    if CHUNK_MB_ENV in environ:
        try:
            chunk_mb = int(environ[CHUNK_MB_ENV])
        except ValueError:
            pass  # vLLM fails on it itself, saying which variable
        else:
            source += f", {CHUNK_MB_ENV}={chunk_mb}"
    broadcast = (chunk_mb * MIB + 1 + workers) * chunks
    response = (queue_chunk + 2) * chunks
    total = replicas * (broadcast + workers * response)
    per = f"{replicas} engine cores x " if replicas > 1 else ""
    what = (
        f"the message queues of its multiprocess executor ({per}{broadcast // MIB} MiB to its workers "
        f"+ {workers} x {response // MIB} MiB of worker responses)"
    )
    return ShmNeed(engine="vLLM", bytes=total, what=what, source=source)
