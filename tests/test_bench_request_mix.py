"""bench/request_mix.py without a GPU: the plan covers every class the issue asks for, and the
client, run against a small HTTP server, sends the waves concurrently and records per class."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest

from tests.support import bench


def _load(name: str) -> ModuleType:
    return bench.load(name)


MIX = _load("request_mix")


def _params(waves: list[list[Any]]) -> list[dict[str, Any]]:
    return [dict(r.params) for w in waves for r in w]


def test_the_plan_covers_every_class_batch_size_and_prompt_length() -> None:
    waves = MIX.plan(max_model_len=8192, max_num_seqs=64, max_num_batched_tokens=4096, tokenizer=False)
    requests = [r for w in waves for r in w]
    assert len(requests) >= 200
    params = _params(waves)
    for key in (
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "seed",
        "logprobs",
        "prompt_logprobs",
        "stop_token_ids",
        "min_tokens",
        "ignore_eos",
        "logit_bias",
        "allowed_token_ids",
    ):
        assert any(key in p for p in params), key
    assert any(p.get("n", 1) > 1 for p in params)
    assert any(p["temperature"] == 0.0 for p in params) and any(p["temperature"] > 0 for p in params)
    lengths = {r.prompt_len for r in requests}
    assert min(lengths) == 1
    # Near max_model_len, with room for the completion, and one past the batch token budget.
    assert max(lengths) + MIX.MAX_TOKENS <= 8192 and max(lengths) > 8000
    assert any(4096 < n < max(lengths) for n in lengths)
    concurrent = [len(w) for w in waves if w[0].phase == "concurrent"]
    assert concurrent == [1, 2, 4, 8, 16, 32, 64]
    firsts = [w[0].kind for w in waves if w[0].phase == "first"]
    assert (
        len(firsts)
        == len(set(firsts))
        == len(MIX.classes(max_model_len=8192, max_num_batched_tokens=4096, tokenizer=False))
    )
    assert not any("structured_outputs" in p for p in params)


def test_structured_output_and_stop_strings_only_with_a_tokenizer() -> None:
    waves = MIX.plan(
        max_model_len=4096, max_num_seqs=256, max_num_batched_tokens=16384, tokenizer=True, total=10
    )
    params = _params(waves)
    assert any("structured_outputs" in p for p in params) and any("stop" in p for p in params)
    assert [len(w) for w in waves if w[0].phase == "concurrent"][-1] == 256
    # A token budget above max_model_len: the "chunked" prompt stays inside max_model_len.
    assert max(r.prompt_len for w in waves for r in w) < 4096


def test_prompts_differ_between_requests_so_prefix_caching_cannot_skip_them() -> None:
    assert MIX.prompt(16, 1) != MIX.prompt(16, 2)
    assert len(MIX.prompt(1, 0)) == 1 and all(t >= 100 for t in MIX.prompt(500, 3))


class _Handler(BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict[str, Any]]] = []
    in_flight = 0
    most = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.bodies.append(doc)
            cls.in_flight += 1
            cls.most = max(cls.most, cls.in_flight)
        # Long enough for a whole wave to be in flight at once on a loaded machine.
        time.sleep(0.15)
        with cls.lock:
            cls.in_flight -= 1
        if doc.get("n", 1) == 3:
            self.send_response(400)
            self.end_headers()
            self.wfile.write(b'{"error": "n=3 refused"}')
            return
        answer = {"choices": [{"token_ids": [1, 2, 3]} for _ in range(doc.get("n", 1))]}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.bodies, _Handler.in_flight, _Handler.most = [], 0, 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_the_client_sends_each_wave_at_once_and_reports_per_class(server: str) -> None:
    waves = MIX.plan(max_model_len=512, max_num_seqs=8, max_num_batched_tokens=128, tokenizer=False, total=40)
    result = MIX.run(server, "/models/m", waves, timeout=10)
    assert result["requests"] == len(_Handler.bodies) == sum(len(w) for w in waves) == 40
    # The waves ran concurrently (how many overlapped at the server is the machine's timing, so
    # only that some did; the client's own record of each wave's size is checked below).
    assert 2 <= _Handler.most <= 8
    body = _Handler.bodies[0]
    assert body["model"] == "/models/m" and body["return_tokens_as_token_ids"] is True
    assert isinstance(body["prompt"], list) and body["max_tokens"] == MIX.MAX_TOKENS
    # The server refused n=3: counted per class with its answer, the rest succeeded.
    assert result["failed_per_class"] == {"n_3": sum(1 for w in waves for r in w if r.kind == "n_3")}
    assert result["ok"] == 40 - result["failed_per_class"]["n_3"]
    assert "n=3 refused" in result["errors"][0]
    assert set(result["first_request_latency_s"]) == {w[0].kind for w in waves if w[0].phase == "first"}
    assert result["concurrent_batch_sizes"] == [1, 2, 4, 8]


def test_a_server_that_is_gone_is_an_error_per_request_not_a_crash() -> None:
    waves = MIX.plan(max_model_len=64, max_num_seqs=2, max_num_batched_tokens=32, tokenizer=False, total=3)
    result = MIX.run("http://127.0.0.1:9", "m", waves[:2], timeout=2)
    assert result["ok"] == 0 and result["requests"] == 2
    assert all(r["status"] == 0 for r in result["records"])


def test_the_flow_counts_files_per_directory_and_compile_lines_after_ready(tmp_path: Path) -> None:
    flow = _load("vllm_image_flow")
    dirs = {"cache_root": tmp_path / "c", "home": tmp_path / "h", "tmp": tmp_path / "t"}
    dirs["cache_root"].mkdir()
    before = flow.snapshot(dirs)
    (dirs["cache_root"] / "triton").mkdir()
    (dirs["cache_root"] / "triton" / "k.cubin").write_text("x")
    dirs["home"].mkdir()
    (dirs["home"] / "f").write_text("y")
    gained = flow.changes(before, flow.snapshot(dirs))[0]
    assert gained == {"cache_root": ["triton/k.cubin"], "home": ["f"]}
    assert flow.count(gained) == 2
    lines = [
        (1.0, "torch.compile took 3.1 s in total\n"),
        (5.0, "INFO: POST /v1/completions HTTP/1.1 200\n"),
        (6.0, "WARNING: FlashInfer is JIT-compiling a module that was not baked\n"),
        (7.0, "DeepGEMM: building kernel sm90_fp8_gemm\n"),
        (8.0, "kernelbake serve: start-up compiled nothing: 0 new files in vllm, triton\n"),
    ]
    found = flow.compile_lines(lines, after=4.0)
    assert len(found) == 2 and found[0].startswith("6.00 WARNING: FlashInfer")
    assert flow.compile_lines(lines, after=None) == []


def test_the_flow_counts_a_rewrite_with_other_bytes_but_not_one_with_the_baked_bytes(
    tmp_path: Path,
) -> None:
    import hashlib
    import os

    flow = _load("vllm_image_flow")
    root = tmp_path / "c"
    (root / "vllm" / "locks").mkdir(parents=True)
    lock, module = root / "vllm" / "locks" / "a.lock", root / "vllm" / "graph.py"
    lock.write_text("")
    module.write_text("baked")
    files = [
        {"path": p.relative_to(root).as_posix(), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in (lock, module)
    ]
    (root / "manifest.json").write_text(json.dumps({"files": files}))
    dirs = {"cache_root": root}
    before = flow.snapshot(dirs)
    lock.write_text("")
    os.utime(lock, ns=(3, 3))
    assert flow.changes(before, flow.snapshot(dirs), dirs)[0] == {}
    assert flow.changes(before, flow.snapshot(dirs))[0] == {"cache_root": ["vllm/locks/a.lock"]}
    module.write_text("regenerated")
    os.utime(module, ns=(4, 4))
    assert flow.changes(before, flow.snapshot(dirs), dirs)[0] == {"cache_root": ["vllm/graph.py"]}


def test_the_summary_puts_the_mix_of_each_start_side_by_side() -> None:
    flow = _load("vllm_image_flow")
    mix = {
        "requests": 200,
        "ok": 200,
        "failed_per_class": {},
        "first_request_latency_s": {"greedy_short": 0.05},
    }
    cold_mix = {**mix, "first_request_latency_s": {"greedy_short": 9.5}}
    doc = {
        "serve_cold": {
            "ready_s": 300.0,
            "request_mix": cold_mix,
            "files_added_after_ready": {
                "tmp": ["kernelbake-cold-x/triton/A/k.cubin", "kernelbake-cold-x/triton/A/k.json"]
            },
            "compile_lines_after_ready": [
                "301.00 (EngineCore pid=7) WARNING [jit_monitor.py:135] Triton kernel JIT compilation during inference: k",
                "302.00 kernelbake serve: start-up compiled nothing: 0 new files in vllm",
            ],
        },
        "serve_warm": {
            "ready_s": 40.0,
            "request_mix": mix,
            # vLLM's ZMQ sockets and kernelbake's own state are not caches; $HOME is.
            "files_added_until_ready": {
                "tmp": [
                    "3389d13a-157a-4946-9490-e0f2d44d448a",
                    "kernelbake-status.json",
                    "kernelbake-gate-ab/verdict",
                ],
                "home": [".tensorrt_llm/cache/gemm_1/nvcc_kernel.cubin"],
            },
            "files_added_after_ready": {},
            "compile_lines_after_ready": [],
        },
        "compile_report": {
            "weights_mode": "dummy",
            "peak_at_aot_save_bytes": 5,
            "ranks": [{"peak_after_aot_save_bytes": 9}],
        },
    }
    s = flow.summary(doc)
    assert s["speedup_ready"] == 7.5
    assert s["files_added_at_warm_start"] == 1
    assert s["files_added_at_warm_start_by_dir"] == {"home": [".tensorrt_llm/cache/gemm_1/nvcc_kernel.cubin"]}
    assert s["files_added_after_ready"] == 0 and s["files_added_after_ready_cold"] == 2
    assert s["compile_lines_after_ready"] == []
    assert s["compile_lines_after_ready_cold"] == [
        "WARNING [jit_monitor.py:135] Triton kernel JIT compilation during inference: k"
    ]
    assert s["first_request_latency_s"] == {"greedy_short": {"baked": 0.05, "cold": 9.5}}
    assert s["requests_after_ready"]["baked"]["requests"] == 200
    assert s["weights_mode"] == "dummy" and s["compile_peak_gpu_bytes"] == 9


def test_the_summary_counts_every_cache_file_a_start_wrote_after_ready_not_the_100_it_lists() -> None:
    flow = _load("vllm_image_flow")
    written = {"cache_root": [f"triton/{i}/k.cubin" for i in range(312)], "tmp": ["kernelbake-status.json"]}
    cold = {
        "request_mix": {"requests": 1, "ok": 1},
        "files_added_after_ready": {k: v[:100] for k, v in written.items()},
        "cache_files_added_after_ready_count": flow.count(flow.cache_files(written)),
    }
    assert flow.mix_summary({"files_added_after_ready": {}}, cold)["files_added_after_ready_cold"] == 312
    # A document from before the count was kept: what its lists hold.
    del cold["cache_files_added_after_ready_count"]
    assert flow.mix_summary({"files_added_after_ready": {}}, cold)["files_added_after_ready_cold"] == 100


def test_merge_resummarises_runs_into_one_result_keyed_by_model(tmp_path: Path) -> None:
    flow = _load("vllm_image_flow")
    start = {"ready_s": 10.0, "files_added_until_ready": {}, "files_added_after_ready": {}}
    for name, model, target in (("a.json", "m1", 6.0), ("b.json", "m2", None)):
        doc = {"serve_warm": start, "serve_cold": {"ready_s": 70.0}, "summary": {}}
        run = {"command": f"run {name}", "models": {model: doc}, "summary": {model: {"target": target}}}
        (tmp_path / name).write_text(json.dumps(run))
    merged = flow.merge(tmp_path / "out.json", [tmp_path / "a.json", tmp_path / "b.json"])
    assert list(merged["summary"]) == ["m1", "m2"]
    assert merged["summary"]["m1"]["speedup_ready"] == 7.0 and merged["summary"]["m1"]["met"] is True
    assert merged["summary"]["m2"]["met"] is None
    assert [r["command"] for r in merged["runs"]] == ["run a.json", "run b.json"]
    assert json.loads((tmp_path / "out.json").read_text())["summary"] == merged["summary"]


def test_merge_takes_a_baked_only_runs_cold_start_from_an_earlier_run_of_the_same_key(
    tmp_path: Path,
) -> None:
    flow = _load("vllm_image_flow")

    def run(name: str, key: str, cold: bool, warm_s: float) -> Path:
        doc: dict[str, Any] = {
            "key": key,
            "serve_warm": {"ready_s": warm_s, "files_added_until_ready": {}, "files_added_after_ready": {}},
        }
        if cold:
            doc["serve_cold"] = {"ready_s": 400.0}
        path = tmp_path / name
        path.write_text(json.dumps({"date": name, "models": {"m": doc}, "summary": {"m": {"target": 6}}}))
        return path

    old, new = run("old.json", "k1", True, 50.0), run("new.json", "k1", False, 40.0)
    merged = flow.merge(tmp_path / "out.json", [old, new])
    m = merged["summary"]["m"]
    assert m["ready_warm_s"] == 40.0 and m["ready_cold_s"] == 400.0 and m["speedup_ready"] == 10.0
    assert m["cold_from"] == {"file": "old.json", "date": "old.json"}
    # Another image key: its cold start is not this image's.
    other = run("other.json", "k2", False, 40.0)
    m = flow.merge(tmp_path / "out.json", [old, other])["summary"]["m"]
    assert m["speedup_ready"] is None and "refused" in m["cold_from"]


def test_merge_names_each_run_by_its_path_from_the_result(tmp_path: Path) -> None:
    # Two sessions' runs with one file name, in their own folders, stay apart.
    flow = _load("vllm_image_flow")
    inputs = []
    for day, model in (("d1", "m1"), ("d2", "m2")):
        (tmp_path / day).mkdir()
        path = tmp_path / day / "moe-run.json"
        path.write_text(json.dumps({"date": day, "models": {model: {"serve_warm": {"ready_s": 1.0}}}}))
        inputs.append(path)
    merged = flow.merge(tmp_path / "out.json", inputs)
    assert [r["file"] for r in merged["runs"]] == ["d1/moe-run.json", "d2/moe-run.json"]
    assert merged["models"]["m2"]["run"] == {"file": "d2/moe-run.json", "date": "d2"}


def test_the_flow_empties_its_work_folder_in_place(tmp_path: Path) -> None:
    # Under device.sh --private-opt the folder is a bind mount: removing it fails (EBUSY).
    flow = _load("vllm_image_flow")
    work = tmp_path / "work"
    (work / "tmp-build" / "x").mkdir(parents=True)
    (work / "file").write_text("x")
    (work / "link").symlink_to(tmp_path)
    inode = work.stat().st_ino
    flow.empty(work)
    assert list(work.iterdir()) == [] and work.stat().st_ino == inode
    assert tmp_path.is_dir()  # the link went, not what it points at
    flow.empty(tmp_path / "new")
    assert (tmp_path / "new").is_dir()


def test_first_launches_with_no_file_added_are_loads_not_compiles() -> None:
    flow = _load("vllm_image_flow")
    line = "5.0 (EngineCore pid=7) WARNING [jit_monitor.py:135] Triton kernel JIT compilation during inference: k"
    warm = {"request_mix": {}, "files_added_after_ready": {}, "compile_lines_after_ready": [line]}
    s = flow.mix_summary(warm, {})
    assert s["loaded_first_launches_after_ready"] == [line.split(" ", 3)[3]]
    warm["files_added_after_ready"] = {"bundle": ["triton/A/k.cubin"]}
    assert flow.mix_summary(warm, {})["loaded_first_launches_after_ready"] == []


def test_prompts_stay_inside_a_small_vocabulary_and_are_unchanged_for_a_large_one(tmp_path: Path) -> None:
    """The CPU image's model has 4,096 token IDs: the mix's prompts drew from 30,000 and vLLM
    refused 35 of 38 requests there (2026-12-05). A GPU model's prompts are the same as before."""
    rm = bench.load("request_mix")
    before = [100 + (3 * 7919 + k * 31) % 30000 for k in range(2000)]
    assert rm.prompt(2000, 3) == rm.prompt(2000, 3, 151936) == rm.prompt(2000, 3, 32000) == before
    small = rm.prompt(2000, 3, 4096)
    assert max(small) < 4096 and min(small) >= 100 and len(set(small)) > 100
    model = tmp_path / "m"
    model.mkdir()
    assert rm.vocab_size(str(model)) is None
    (model / "config.json").write_text('{"vocab_size": 4096}')
    assert rm.vocab_size(str(model)) == 4096
    (model / "config.json").write_text("[]")
    assert rm.vocab_size(str(model)) is None
