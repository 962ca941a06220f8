"""The GPU harness that executes a rendered Dockerfile without Docker (bench/vllm_image_flow.py)
must read what ``render`` writes today: if the template changes shape, this fails on CPU
instead of during a device session."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

from kernelbake.contract.engines import VLLM
from kernelbake.contract.layout import CACHE_ROOT
from kernelbake.plan import plan
from kernelbake.render import render, write_context
from kernelbake.spec import load_spec
from tests.conftest import REPO


def _flow() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_image_flow", REPO / "bench" / "vllm_image_flow.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _context(tmp_path: Path) -> Path:
    (target,) = plan(load_spec(REPO / "bench" / "specs" / "tiny-llama-ref.yaml"), ["h200"])
    wheel = tmp_path / "kernelbake-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"not a real wheel")
    rendered = render(target, wheel=wheel.name)
    return write_context(rendered, tmp_path / "context", wheel)


def test_the_harness_reads_the_rendered_stages(tmp_path: Path) -> None:
    flow = _flow()
    stages = flow.stages(_context(tmp_path) / "Dockerfile")
    assert list(stages) == ["runtime", "compile", "caches", "final"]
    (run,) = [rest for word, rest in stages["compile"] if word == "RUN"]
    assert flow._flags(run) == ({"device": "nvidia.com/gpu=all"}, "python3 -m kernelbake compile")
    entrypoint = next(rest for word, rest in stages["final"] if word == "ENTRYPOINT")
    assert json.loads(entrypoint) == ["python3", "-m", "kernelbake", "serve"]


def test_the_harness_moves_the_bundle_like_the_cache_layers(tmp_path: Path) -> None:
    flow = _flow()
    context = _context(tmp_path)
    stages = flow.stages(context / "Dockerfile")
    compiled = tmp_path / "compile-fs"
    for kind in VLLM.cache_kinds:
        (compiled / CACHE_ROOT.lstrip("/") / kind.value).mkdir(parents=True)
    (compiled / CACHE_ROOT.lstrip("/") / "vllm" / "artifact").write_text("aot")
    (compiled / CACHE_ROOT.lstrip("/") / "manifest.json").write_text("{}")
    logs = tmp_path / "logs"
    logs.mkdir()
    record: list[dict[str, object]] = []

    runtime_env: dict[str, str] = {}
    runtime_fs = tmp_path / "runtime-fs"
    no_run = [(w, r) for w, r in stages["runtime"][1:] if w != "RUN"]
    flow.Stage(context, runtime_env, logs, record, runtime_fs).run("runtime", no_run, {})
    assert runtime_env["VLLM_CACHE_ROOT"] == f"{CACHE_ROOT}/vllm"
    assert (runtime_fs / "opt/kernelbake/target.json").read_text() == (context / "target.json").read_text()
    assert (runtime_fs / "models/tiny-llama-ref/config.json").is_file()

    staging = tmp_path / "caches-fs"
    staging.mkdir()
    flow.Stage(context, {}, logs, record, staging).run("caches", stages["caches"][1:], {"compile": compiled})
    final_fs = tmp_path / "final-fs"
    flow.Stage(context, {}, logs, record, final_fs).run("final", stages["final"][1:], {"caches": staging})
    root = final_fs / CACHE_ROOT.lstrip("/")
    assert (root / "vllm" / "artifact").read_text() == "aot"
    assert (root / "manifest.json").is_file()
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [k.value for k in VLLM.cache_kinds] + ["manifest.json"]
    )
