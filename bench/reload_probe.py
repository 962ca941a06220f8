"""How long vLLM takes to reload a model's weights after a wake-up, by the way it reads them:
the question behind a restore's last phase (issue 40).

A snapshot taken with its weights outside is restored asleep, woken, and its weights reloaded
with vLLM's ``reload_weights``. On the H100 (vLLM 0.32, bench/results/
vllm-0.32.0-h100-moe-snapshot-2026-12-06) that reload took the FP8 MoE 13.93 s with every byte
of its 31.2 GB in the page cache: the restore's other phases took 2.8 s. This starts vLLM once,
in this process, on a checkpoint (bench/fake_checkpoint.py makes one from a config), with sleep
mode, and for each way of reloading puts it to sleep (level 2: weights discarded), wakes it,
reloads and generates again, with the page cache warm and dropped:

- ``checkpoint``: what serve asks today (``reload_weights``: the checkpoint's tensors through the
  model's ``load_weights``, then each layer's processing);
- ``checkpoint-threads``: the same with vLLM's own multi-threaded safetensors reader
  (``model_loader_extra_config`` ``enable_multithread_load``, ``num_threads``), set on the
  worker's load config for that reload only (vLLM leaves the load config out of its compile
  hash, so a serve argument that sets it does not change the kernels);
- ``state-copy``: the weights as the engine holds them after processing, written once by
  vLLM's ``save_sharded_state``, each tensor copied into the model's parameter or buffer of its
  name (no processing): what a restore could reach if the node held its weights in the kernel's
  format. Whether that is all the engine's weights memory (sleep level 2 discards every
  allocation made while loading, not only the state dict) is what the tokens say;
- ``kernel-format``: the same files through vLLM's own ``reload_weights(...,
  is_checkpoint_format=False)``. Last, since that reload points the model's path at the saved
  directory. On vLLM 0.32 it resolves every name as a parameter, so a model with buffers in its
  state (the attention scales) fails there (H100, 2026-12-06).

Each run's greedy tokens (16, from fixed prompt ids) are compared with the first start's. First,
awake, the checkpoint ways' weights iterator alone (``reads``): the reading's share of a reload.

    python3 bench/fake_checkpoint.py /root/ck8b          # after copying a config.json there
    python3 bench/reload_probe.py --model /root/ck8b --kernel-dir /root/kfmt --out DIR

Needs root to drop the page cache (the device runs as root; without it the dropped runs are
left out and said so). Prints JSON; writes DIR/reload-probe.json. What needs no GPU (the order
of runs, how a run is measured and judged) is tested in tests/test_bench_reload_probe.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

# The sibling scripts and the tree's src, as bench/vllm_image_flow.py finds them.
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))
from disk_read_probe import emit, write
from kernelbake.runtime.snapshot import readahead
from snapshot_pages import drop_page_cache

METHODS = ("checkpoint", "checkpoint-threads", "state-copy", "kernel-format")
# The ways that read save_sharded_state's files rather than the checkpoint.
KERNEL_FORMAT = ("state-copy", "kernel-format")
# A prompt of fixed token ids: the probe needs no tokenizer (the checkpoint has none).
PROMPT = [9707, 11, 1879, 0, 576, 374, 264, 1273, 315, 279, 6573, 17189, 13]


class Engine(Protocol):
    def generate(self) -> list[int]: ...
    def sleep(self) -> None: ...
    def wake(self) -> None: ...
    def reload(self, method: str) -> dict[str, Any] | None: ...
    def save_kernel_format(self) -> int: ...
    def read_only(self, method: str) -> int: ...


def plan(methods: tuple[str, ...] | list[str], drop: bool) -> list[tuple[str, str]]:
    """(method, page cache) in the order they run: the checkpoint ways, then ``state-copy``, then
    ``kernel-format`` (its reload points the model at the saved directory), each warm before
    dropped."""
    ordered = sorted(methods, key=lambda m: (m in KERNEL_FORMAT, m == "kernel-format"))
    return [(m, cache) for m in ordered for cache in (("warm", "dropped") if drop else ("warm",))]


def measure(
    engine: Engine,
    runs: list[tuple[str, str]],
    reference: list[int],
    warm: Callable[[str], None],
    drop: Callable[[], None],
    done: Callable[[list[dict[str, Any]]], None] = lambda runs: None,
) -> list[dict[str, Any]]:
    """Each run: asleep, the page cache made warm or dropped, woken, reloaded, tokens compared.
    A run that raises is recorded with its error, and the rest go on (the engine is woken
    again where it can be). ``done`` is told the runs so far after each."""
    out: list[dict[str, Any]] = []
    saved = False
    for method, cache in runs:
        run: dict[str, Any] = {"method": method, "page_cache": cache}
        try:
            if method in KERNEL_FORMAT and not saved:
                t = time.monotonic()
                run["kernel_format_bytes"] = engine.save_kernel_format()
                run["kernel_format_saved_s"] = round(time.monotonic() - t, 3)
                saved = True
            engine.sleep()
            if cache == "warm":
                warm(method)
            else:
                drop()
            t0 = time.monotonic()
            engine.wake()
            t1 = time.monotonic()
            said = engine.reload(method)
            t2 = time.monotonic()
            run.update(wake_s=round(t1 - t0, 3), reload_s=round(t2 - t1, 3), **(said or {}))
            run["tokens_identical"] = engine.generate() == reference
        except Exception as exc:  # a probe records what failed and goes on
            run["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        out.append(run)
        done(out)
    return out


def reads(engine: Engine, methods: list[str], warm: Callable[[str], None]) -> list[dict[str, Any]]:
    """For each checkpoint way of reading, the loader's weights iterator alone, page cache warm,
    awake, nothing loaded into the model: how much of a reload is reading and how much is
    loading and processing."""
    out: list[dict[str, Any]] = []
    for method in (m for m in methods if m not in KERNEL_FORMAT):
        run: dict[str, Any] = {"method": method}
        try:
            warm(method)
            t = time.monotonic()
            run["bytes"] = engine.read_only(method)
            run["read_s"] = round(time.monotonic() - t, 3)
        except Exception as exc:  # a probe records what failed and goes on
            run["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        out.append(run)
    return out


def _loader_extra(method: str, threads: int) -> dict[str, Any]:
    return {"enable_multithread_load": True, "num_threads": threads} if method == "checkpoint-threads" else {}


@contextlib.contextmanager
def _loader_config(worker: Any, extra: dict[str, Any]) -> Iterator[Any]:
    """On the worker: the load config a loader is built from set to ``extra`` for the block,
    then put back as it was; the model runner."""
    runner = worker.model_runner
    load_config = runner.vllm_config.load_config
    before = load_config.model_loader_extra_config
    load_config.model_loader_extra_config = dict(extra)
    try:
        yield runner
    finally:
        load_config.model_loader_extra_config = before


def _read_only(worker: Any, extra: dict[str, Any]) -> int:
    # Runs on the worker (collective_rpc with a callable): the weights iterator a reload would
    # consume, each tensor dropped as it comes (the bytes it yielded).
    from vllm.model_executor.model_loader import get_model_loader

    with _loader_config(worker, extra) as runner:
        loader = get_model_loader(runner.vllm_config.load_config)
        got = 0
        # A safetensors tensor is a view of a mapped file until something reads it: each one
        # goes to the GPU, as the reload's copy would take it, so the bytes are really read.
        for _name, tensor in loader.get_all_weights(runner.vllm_config.model_config, runner.get_model()):
            tensor.to(runner.device)
            got += tensor.numel() * tensor.element_size()
        return got


def _reload_kernel_format(worker: Any, path: str) -> None:
    # Runs on the worker: the kernel-format reload copies into the model's parameters in place,
    # which autograd refuses outside no-grad mode (the first H100 try, 2026-12-06).
    import torch

    with torch.inference_mode():
        worker.reload_weights(weights_path=path, is_checkpoint_format=False)


def _state_copy(worker: Any, path: str) -> dict[str, int]:
    # Runs on the worker: each saved tensor copied into the model's parameter or buffer of that
    # name, in inference mode (an in-place copy into a parameter otherwise trips autograd).
    import torch
    from safetensors import safe_open

    model = worker.model_runner.get_model()
    # Every name, a tied tensor's too (lm_head and the embeddings): the saved files may hold
    # either name.
    targets = dict(model.named_parameters(remove_duplicate=False))
    targets.update(model.named_buffers(remove_duplicate=False))
    copied: set[str] = set()
    with torch.inference_mode():
        for file in sorted(Path(path).glob("*.safetensors")):
            with safe_open(str(file), framework="pt", device="cpu") as saved:
                for name in saved.keys():  # noqa: SIM118 (a safe_open handle is not iterable)
                    targets[name].copy_(saved.get_tensor(name))
                    copied.add(name)
    # The tensors (not names: a tied one has two) no saved file covered: left as the wake-up
    # found them, their memory discarded.
    covered = {id(targets[name]) for name in copied}
    return {"copied": len(copied), "not_in_files": len({id(t) for t in targets.values()} - covered)}


def _reload(worker: Any, extra: dict[str, Any]) -> None:
    # Runs on the worker: serve's reload (``reload_weights``), its loader built from ``extra``.
    with _loader_config(worker, extra):
        worker.reload_weights()


class VllmEngine:
    """vLLM in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so that a callable reaches
    the worker."""

    def __init__(
        self, model: Path, kernel_dir: Path, threads: int, a: argparse.Namespace, **engine_args: Any
    ) -> None:
        # ``engine_args``: more of LLM's arguments (bench/beside_probe.py's worker extension).
        from vllm import LLM

        self.model, self.kernel_dir, self.threads = model, kernel_dir, threads
        self.llm = LLM(
            model=str(model),
            enable_sleep_mode=True,
            enforce_eager=True,
            skip_tokenizer_init=True,
            load_format="safetensors",
            seed=0,
            max_model_len=a.max_model_len,
            # One short prompt at a time: no more batch than that for the start to profile.
            max_num_batched_tokens=a.max_model_len,
            max_num_seqs=8,
            gpu_memory_utilization=a.gpu_memory_utilization,
            **engine_args,
        )

    def generate(self) -> list[int]:
        from vllm.inputs import TokensPrompt

        from vllm import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=16, detokenize=False)
        got = self.llm.generate([TokensPrompt(prompt_token_ids=PROMPT)], params, use_tqdm=False)
        return list(got[0].outputs[0].token_ids)

    def sleep(self) -> None:
        self.llm.sleep(level=2)

    def wake(self) -> None:
        self.llm.wake_up()

    def reload(self, method: str) -> dict[str, Any] | None:
        if method == "state-copy":
            return dict(self.llm.collective_rpc(_state_copy, args=(str(self.kernel_dir),))[0])
        if method == "kernel-format":
            self.llm.collective_rpc(_reload_kernel_format, args=(str(self.kernel_dir),))
            return None
        self.llm.collective_rpc(_reload, args=(_loader_extra(method, self.threads),))
        return None

    def read_only(self, method: str) -> int:
        return int(self.llm.collective_rpc(_read_only, args=(_loader_extra(method, self.threads),))[0])

    def save_kernel_format(self) -> int:
        self.kernel_dir.mkdir(parents=True, exist_ok=True)
        self.llm.collective_rpc("save_sharded_state", kwargs={"path": str(self.kernel_dir)})
        return sum(p.stat().st_size for p in self.kernel_dir.glob("*.safetensors"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", type=Path, required=True, help="a checkpoint directory (config.json, *.safetensors)"
    )
    ap.add_argument(
        "--kernel-dir",
        type=Path,
        required=True,
        help="where save_sharded_state writes (emptied first; as large as the checkpoint)",
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    a = ap.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # The FP8 MoE's start would otherwise JIT DeepGEMM for every batch shape (minutes on a bare
    # machine; its cold start spent 386 s in graphs and warm-up): the probe's 16 tokens build
    # what they use, and a reload does not touch the kernels.
    os.environ.setdefault("VLLM_DEEP_GEMM_WARMUP", "skip")
    try:
        drop_page_cache()
        can_drop = True
    except OSError as exc:
        print(f"reload_probe: cannot drop the page cache ({exc}): warm runs only", file=sys.stderr)
        can_drop = False
    for stale in a.kernel_dir.glob("*.safetensors"):
        stale.unlink()
    t = time.monotonic()
    engine = VllmEngine(a.model, a.kernel_dir, a.threads, a)
    started = time.monotonic() - t
    reference = engine.generate()

    def warm(method: str) -> None:
        # Every byte the reload reads, in the page cache before it starts.
        files = readahead.weight_files(a.kernel_dir if method in KERNEL_FORMAT else a.model)
        readahead.read(files, sum(p.stat().st_size for p in files))

    import torch

    import vllm

    doc: dict[str, Any] = {
        "bench": "reload_probe",
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "model": str(a.model),
        # On a tmpfs (/dev/shm) the kernel format's "dropped" runs read memory all the same.
        "kernel_dir": str(a.kernel_dir),
        "checkpoint_bytes": sum(p.stat().st_size for p in readahead.weight_files(a.model)),
        "started_s": round(started, 2),
        "reference_tokens": reference,
    }
    path = a.out / "reload-probe.json"

    def so_far(runs: list[dict[str, Any]]) -> None:
        # A device lease can end mid-run: what is measured is on disk after each run.
        write({**doc, "runs": runs, "partial": True}, path)

    doc["reads"] = reads(engine, a.methods.split(","), warm)
    so_far([])
    doc["runs"] = measure(
        engine, plan(a.methods.split(","), can_drop), reference, warm, drop_page_cache, so_far
    )
    return emit(doc, path)


if __name__ == "__main__":
    sys.exit(main())
