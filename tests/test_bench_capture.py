"""The GPU capture bench (bench/vllm_capture.py) on the CPU: the classes it sends still miss the
build's warm-up and survive serve's notes, a rebuild is judged and stamped as ``capture rebuild``
judges one, the poison goes into a kernel, the delta lands where the runtime reads it, and the
verdict needs every part of the issue's measurement."""

from __future__ import annotations

import json
import types
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kernelbake.contract.delta import DELTA_MANIFEST, DeltaFile, DeltaManifest, Origin
from kernelbake.contract.key import parse_key
from kernelbake.contract.layout import CacheKind
from kernelbake.contract.record import CaptureRecord, RequestClass, WaveSource
from kernelbake.runtime.engines.vllm import misses, warmup
from kernelbake.runtime.env import RuntimeEnv
from tests.support import bench
from tests.vllm.test_misses import params

KEY = parse_key(
    "kb1:engine=vllm;engine_version=0.26.0;torch=2.11.0;triton=3.6.0;cuda=13.0;flashinfer=0.6.14;"
    "python=3.12;arch=sm_90;device=h200;driver_floor=580;model=local/tiny-llama-ref;revision=r;"
    "model_path=/models/tiny-llama-ref;dtype=bfloat16;quantization=none;tp=1;pp=1;ep=1;max_model_len=4096;"
    "max_num_batched_tokens=16384;compilation=44136fa355b3678a;engine_env=4f53cda18c2baa0c;kernelbake=0.1.0"
)


@pytest.fixture(scope="module")
def capture() -> ModuleType:
    return bench.load("vllm_capture")


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_the_classes_miss_the_warm_up_and_survive_serves_notes(capture: ModuleType) -> None:
    # _topk_log_softmax_kernel's TOPK_BLOCK_SIZE is next_power_of_2(1 + logprobs): the blocks
    # the build's warm-up reaches, against the class's.
    warm = {
        p.get("logprobs")
        for _len, p in warmup._classes(4096, 16384, 32000).values()
        if p.get("logprobs") is not None
    }
    blocks = {_pow2(1 + n) for n in warm}
    assert _pow2(1 + capture.CLASSES["logprobs_20"]["logprobs"]) not in blocks
    assert not any("logprob_token_ids" in p for _l, p in warmup._classes(4096, 16384, 32000).values())
    for name, body in capture.CLASSES.items():
        sampling = {k: v for k, v in body.items() if k not in ("max_tokens",)}
        if sampling.get("logprob_token_ids"):
            # As vLLM's completions layer builds SamplingParams (0.26 and 0.32): logprobs=None
            # when the request names token IDs.
            sampling["logprobs"] = None
        noted = misses.request_class(params(max_tokens=body["max_tokens"], **sampling), capture.PROMPT_TOKENS)
        assert noted is not None and noted.problem() is None, name
        kept = json.loads(noted.body)
        if "logprob_token_ids" in body:
            assert len(kept["logprob_token_ids"]) == len(body["logprob_token_ids"])
            # The completions API answers HTTP 400 to logprob_token_ids without logprobs.
            assert kept["logprobs"] == len(body["logprob_token_ids"])
        else:
            assert kept["logprobs"] == body["logprobs"], "what selects the kernel survives the notes"


def test_the_poison_goes_into_a_kernel_and_the_delta_where_the_runtime_reads_it(
    capture: ModuleType,
) -> None:
    new = ["triton/ab/_k.json", "triton/ab/_k.cubin", "triton/ab/_k.ptx", "inductor/x/y.py"]
    assert capture.poison_target(new) == "triton/ab/_k.cubin"
    assert capture.poison_target(["inductor/x/y.py", "inductor/x/y.cpp"]) == "inductor/x/y.py"
    assert capture.poison_target([]) is None
    # The flow's target.json sits beside the cache root; serve reads a delta beside both.
    env = RuntimeEnv.from_env({"KERNELBAKE_UNSAFE_TARGET": "/opt/kernelbake/target.json"})
    assert env.delta_root == Path("/opt/kernelbake/cache").parent / "delta"


def _record(tmp_path: Path, claims: dict[str, bytes]) -> Path:
    cls = RequestClass.of({"max_tokens": 8, "logprobs": 20}, prompt_tokens=24)
    record = CaptureRecord.build(
        key=KEY,
        base_manifest="sha256:" + "b" * 64,
        replica="replica",
        waves=[([(cls, 1)], WaveSource.SERVED, ["triton _topk_log_softmax_kernel 5f2c"])],
        claims=[
            DeltaFile(path=p, size=len(b), sha256=capture_sha(b), kind=CacheKind(p.split("/")[0]))
            for p, b in claims.items()
        ],
    )
    path = tmp_path / "record.json"
    path.write_text(record.to_json())
    return path


def capture_sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def _collected(tmp_path: Path, files: dict[str, bytes]) -> Path:
    staging = tmp_path / "collected"
    for rel, data in files.items():
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        (staging / rel).write_bytes(data)
    delta = DeltaManifest(
        key=KEY,
        base_image=None,
        base_manifest="sha256:" + "b" * 64,
        files=tuple(
            DeltaFile(path=p, size=len(b), sha256=capture_sha(b), kind=CacheKind(p.split("/")[0]))
            for p, b in files.items()
        ),
    )
    (staging / DELTA_MANIFEST).write_text(delta.to_json())
    return staging


def test_a_rebuild_is_judged_and_stamped_as_capture_rebuild_does(capture: ModuleType, tmp_path: Path) -> None:
    cubin, json_ = "triton/5f2c/_topk_log_softmax_kernel.cubin", "triton/5f2c/_topk_log_softmax_kernel.json"
    record = _record(tmp_path, {cubin: b"cubin" + capture.POISON, json_: b"{}", "triton/zz/planted.so": b"x"})
    staging = _collected(tmp_path, {cubin: b"cubin", json_: b"{}"})
    done = capture.finish(record, staging, tmp_path / "delta", image_digest="sha256:" + "c" * 64)
    delta = DeltaManifest.from_json((tmp_path / "delta" / DELTA_MANIFEST).read_text())
    assert (
        delta.origin is Origin.REBUILT
        and delta.rebuild is not None
        and delta.rebuild.builder == capture.BUILDER
    )
    assert delta.rebuild.dropped == ("triton/zz/planted.so",)
    assert done["differed"] == [cubin] and done["reproduced"] == [json_]
    assert (tmp_path / "delta" / cubin).read_bytes() == b"cubin", "the rebuild's bytes, not the replica's"
    assert done["record_waves"][0]["source"] == "served"
    assert done["delta_json_sha256"] == "sha256:" + capture_sha(
        (tmp_path / "delta" / DELTA_MANIFEST).read_bytes()
    )


def test_determinism_is_per_kind_with_what_differs(capture: ModuleType) -> None:
    first = {"triton/a/k.cubin": "1", "triton/a/k.json": "2", "inductor/x/g.py": "3"}
    second = {"triton/a/k.cubin": "1", "triton/a/k.json": "9", "inductor/y/g.py": "3"}
    found = capture.determinism(first, second, ("replica", "rebuilt"))
    assert found["triton"] == {
        "replica_files": 2,
        "rebuilt_files": 2,
        "same_paths": 2,
        "same_bytes": 1,
        "other_bytes": ["triton/a/k.json"],
        "only_replica": [],
        "only_rebuilt": [],
    }
    assert found["inductor"]["same_paths"] == 0 and found["inductor"]["only_rebuilt"] == ["inductor/y/g.py"]


FIRST_LAUNCH = (
    "29.17 (EngineCore pid=3046) WARNING 12-05 15:28:51 [jit_monitor.py:135] Triton kernel JIT "
    "compilation during inference: _fill_logprob_token_ids_kernel. This causes a latency spike; "
    "consider extending warmup to cover this shape/config."
)
INDUCTOR_COMPILE = (
    "31.02 (EngineCore pid=3046) INFO [backends.py:398] Compiling a graph for compile range (1, 8)"
)


def _doc(**edits: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "replica": {
            "classes": {
                "logprobs_20": {"files_added_count": 8},
                "logprob_token_ids": {"files_added_count": 0},
            },
            "poisoned": {"path": "triton/a/k.cubin", "sha256": "bad"},
        },
        "rebuild": {
            "files": {"triton/a/k.cubin": "good"},
            "differed": ["triton/a/k.cubin"],
            "dropped": [],
            "record_waves": [{"source": "served", "requests": [[0, 1]], "compiled": []}],
        },
        "next_replica": {
            "merged": [
                "kernelbake serve: cache delta sha256:… merged into the caches (rebuilt by bench-device)"
            ],
            "classes": {
                "logprobs_20": {"files_added_count": 0},
                "logprob_token_ids": {"files_added_count": 0},
            },
        },
    }
    for path, value in edits.items():
        part, _, key = path.partition("__")
        doc[part][key] = value
    return doc


@pytest.mark.parametrize(
    ("edits", "met"),
    [
        ({}, True),
        ({"next_replica__classes": {"logprobs_20": {"files_added_count": 3}}}, False),
        ({"rebuild__record_waves": [{"source": "operator", "requests": [[0, 1]], "compiled": []}]}, False),
        ({"rebuild__files": {"triton/a/k.cubin": "bad"}}, False),
        ({"next_replica__merged": []}, False),
        ({"replica__classes": {"logprobs_20": {"files_added_count": 0}}}, False),
        # The H200 run of 2026-12-05: a class the replay could not send.
        (
            {
                "rebuild__replay": {
                    "rc": 0,
                    "lines": [
                        "kernelbake capture: replayed 2 requests in 2 batches on /models/m (0.24 s, 0.00 s)",
                        "kernelbake capture: request 1.0: HTTP 400",
                    ],
                }
            },
            False,
        ),
        # The H100 run of 2026-12-05: vLLM's JIT monitor names both kernels at their first
        # launch, which Triton loaded from the merged delta (no file written): met...
        ({"next_replica__server": {"compile_lines_after_ready": [FIRST_LAUNCH]}}, True),
        # ...but a line that is not a first launch is a compile, files or not.
        ({"next_replica__server": {"compile_lines_after_ready": [INDUCTOR_COMPILE]}}, False),
    ],
)
def test_the_verdict_needs_every_part_of_the_measurement(
    capture: ModuleType, edits: dict[str, Any], met: bool
) -> None:
    found = capture.summary(_doc(**edits))
    assert found["met"] is met
    assert bool(found["rebuild_replay_refused"]) is ("rebuild__replay" in edits)
    lines = edits.get("next_replica__server", {}).get("compile_lines_after_ready", [])
    assert found["next_replica_loaded_first_launches"] == [ln for ln in lines if ln == FIRST_LAUNCH]
    assert found["next_replica_compile_lines_after_ready"] == [ln for ln in lines if ln != FIRST_LAUNCH]
    if met:
        assert found["poisoned_bytes_in_rebuilt_delta"] is False and found["poisoned_named_as_other_bytes"]
        assert found["record_served_waves"] == 1 and found["record_operator_waves"] == 0


def test_the_rebuild_sends_what_serve_noted(
    capture: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bench's rebuild runs the in-image commands a real rebuild runs, with the record's path."""
    calls: list[tuple[str, ...]] = []
    image = types.SimpleNamespace(
        fresh=lambda **_k: None,
        env=lambda phase, **extra: {"phase": phase, **extra},
        argv=["serve"],
        logs=tmp_path,
        started=0.0,
        deadline=1e9,
        kernelbake=lambda env, *args, log: calls.append(args) or {"rc": 0, "lines": []},
    )

    class Server:
        def __init__(self, *a: Any) -> None:
            self.port, self.ready_s = 8123, 1.0

        def stop(self) -> dict[str, Any]:
            return {"compile_lines_after_ready": []}

    monkeypatch.setattr(capture.flow, "Server", Server)
    monkeypatch.setattr(capture.flow, "wait_ready", lambda *a: None)
    done = capture.rebuild(image, tmp_path)
    assert calls[0][:3] == ("capture", "replay", "--record") and calls[0][3] == str(tmp_path / "record.json")
    assert calls[1][:2] == ("capture", "collect") and done["compiled_nothing"] is True
