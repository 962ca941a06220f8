"""How long the restore's last phase takes with the weights kept beside the snapshot (issue 40,
``kernelbake snapshot take --weights beside``), against vLLM's reload from the checkpoint, on
one engine in this process, and whether the engine's tokens survive it.

vLLM starts once (sleep mode, kernelbake's worker extension ``SnapshotWeights``) on a checkpoint
bench/fake_checkpoint.py writes from a config, generates 16 greedy tokens from fixed prompt ids,
and saves its weight memory with the extension's ``kernelbake_save_weights`` (what take does).
Then, ``--runs`` times: sleep at level 2 (weights discarded, as before a dump), wake, copy the
saved weights back (``kernelbake_load_weights``: what serve does after a restore's wake-up) and
generate again. Last, the same sleep and wake with vLLM's ``reload_weights`` from the checkpoint
(what a snapshot taken ``--weights outside`` does), for comparison on the same machine. No CRIU
here: what the copy replaces is the reload, and the restore's other phases are the flow's
(bench/snapshot_flow.py). The saved files go to ``--weights-dir`` (``/dev/shm`` by default:
memory, as a page cache holding the snapshot is). Writes DIR/beside-probe.json after each step.

    python3 bench/beside_probe.py --config bench/models/qwen3-30b-a3b-fp8/config.json \
        --model /models/moe --out DIR
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1] / "src"))
import fake_checkpoint
from disk_read_probe import emit, write
from kernelbake.contract.snapshot import LOAD_WEIGHTS, SAVE_WEIGHTS, WEIGHTS_EXTENSION
from reload_probe import VllmEngine


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, required=True, help="the model's config.json")
    ap.add_argument("--model", type=Path, required=True, help="where the checkpoint is written")
    ap.add_argument("--weights-dir", type=Path, default=Path("/dev/shm/kernelbake-beside"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    out = a.out / "beside-probe.json"
    doc: dict[str, Any] = {"bench": "beside_probe", "command": " ".join(sys.argv), "runs": []}
    a.model.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(a.config, a.model / "config.json")
    doc["checkpoint"] = fake_checkpoint.write(a.model, 0)
    write(doc, out)
    # The start's DeepGEMM warm-up and CUDA graphs are not what this measures (minutes on a bare
    # machine for the MoE); in-process, so that the extension's methods reach the worker. The
    # engine is reload_probe's, with kernelbake's worker extension.
    os.environ.update(VLLM_DEEP_GEMM_WARMUP="skip", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    t = time.monotonic()
    engine = VllmEngine(a.model, a.weights_dir, 0, a, worker_extension_cls=WEIGHTS_EXTENSION)
    llm, generate = engine.llm, engine.generate
    doc["start_s"] = round(time.monotonic() - t, 2)

    def timed(what: str, run: dict[str, Any], call: Any) -> Any:
        t = time.monotonic()
        value = call()
        run[what] = round(time.monotonic() - t, 3)
        return value

    doc["tokens"] = generate()
    shutil.rmtree(a.weights_dir, ignore_errors=True)
    doc["saved"] = timed(
        "save_s", doc, lambda: llm.collective_rpc(SAVE_WEIGHTS, kwargs={"path": str(a.weights_dir)})[0]
    )
    write(doc, out)
    for way in ["beside"] * a.runs + ["checkpoint"]:
        run: dict[str, Any] = {"way": way}
        timed("sleep_s", run, lambda: llm.sleep(level=2))
        timed("wake_s", run, llm.wake_up)
        if way == "beside":
            run["copied"] = timed(
                "weights_s",
                run,
                lambda: llm.collective_rpc(LOAD_WEIGHTS, kwargs={"path": str(a.weights_dir)})[0],
            )
        else:
            timed("weights_s", run, lambda: llm.collective_rpc("reload_weights"))
        run["tokens_identical"] = generate() == doc["tokens"]
        doc["runs"].append(run)
        write(doc, out)
    shutil.rmtree(a.weights_dir, ignore_errors=True)
    return emit(doc, out)


if __name__ == "__main__":
    raise SystemExit(main())
