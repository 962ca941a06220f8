"""Rendering is pure: Dockerfiles and bake files from specs, no Docker."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import pytest

from kernelbake.bake import bakefile
from kernelbake.contract.engines import VLLM
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput
from kernelbake.plan import BuildTarget, plan
from kernelbake.render import BuildMode, Rendered, render, write_context
from kernelbake.spec import load_spec
from tests.conftest import REPO


def _target(spec: str, gpu: str) -> BuildTarget:
    (target,) = plan(load_spec(REPO / "images" / f"{spec}.yaml"), [gpu], registry="reg.example/kb")
    return target


def _stages(dockerfile: str) -> dict[str, list[str]]:
    """Instructions per stage (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n\s*", " ", dockerfile)
    stages: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.match(r"FROM (\S+) AS (\S+)", line)
        if m:
            current = m.group(2)
            stages[current] = [line]
        else:
            stages[current].append(line)
    return stages


def _render(spec: str, gpu: str, **kw: object) -> Rendered:
    return render(_target(spec, gpu), wheel="kb.whl", **kw)  # type: ignore[arg-type]


def test_cpu_target_compiles_in_a_plain_run() -> None:
    r = _render("tiny-llama-torch", "cpu")
    assert "syntax=" not in r.dockerfile
    assert "--device" not in r.dockerfile
    stages = _stages(r.dockerfile)
    assert list(stages) == ["runtime", "compile", "caches", "cache-artifact", "final"]
    assert stages["compile"] == ["FROM runtime AS compile", "RUN python3 -m kernelbake compile"]
    assert stages["runtime"][0] == "FROM kernelbake/cpu-base:bookworm-torch2.13.0 AS runtime"
    assert "COPY model/ /models/tiny-llama/" in stages["runtime"]


def test_final_layer_order_is_install_target_model_kinds_manifest() -> None:
    r = _render("qwen3-8b", "h100")
    runtime, final = _stages(r.dockerfile)["runtime"], _stages(r.dockerfile)["final"]
    layer_steps = [s for s in runtime + final if s.split()[0] in ("RUN", "COPY")]
    assert layer_steps[0].startswith("RUN --mount=type=bind,source=wheels")
    assert "pip install --no-deps" in layer_steps[0]
    assert layer_steps[1] == "COPY target.json /opt/kernelbake/target.json"
    assert layer_steps[2] == "RUN --mount=type=secret,id=hf_token python3 -m kernelbake fetch-model"
    kinds = [k.value for k in VLLM.cache_kinds]
    # The manifest's copy outside the cache root, which the runtime checks the cache root's against.
    assert layer_steps[3] == "COPY --from=caches /manifest.json /opt/kernelbake/pinned-manifest.json"
    assert layer_steps[4:-1] == [f"COPY --from=caches /{k}/ /opt/kernelbake/cache/{k}/" for k in kinds]
    assert layer_steps[-1] == "COPY --from=caches /manifest.json /opt/kernelbake/cache/manifest.json"
    # Nothing after the manifest adds a layer.
    after = final[final.index(layer_steps[-1]) + 1 :]
    assert all(s.split()[0] in ("LABEL", "EXPOSE", "ENTRYPOINT", "CMD", "ENV") for s in after)


def test_vllm_gpu_single_mode_requests_the_device_with_the_labs_frontend() -> None:
    r = _render("qwen3-8b", "h100")
    assert r.dockerfile.startswith("# syntax=docker/dockerfile:1-labs\n")
    stages = _stages(r.dockerfile)
    assert stages["compile"][1] == "RUN --device=nvidia.com/gpu=all python3 -m kernelbake compile"
    # Compile and serve share one base and one runtime stage: same Python, paths, model dir.
    assert stages["runtime"][0] == "FROM docker.io/vllm/vllm-openai:v0.26.0 AS runtime"
    assert stages["compile"][0] == "FROM runtime AS compile"
    assert stages["final"][0] == "FROM runtime AS final"
    assert stages["final"][-1] == "CMD []"
    assert 'ENTRYPOINT ["python3", "-m", "kernelbake", "serve"]' in stages["final"]


def test_two_phase_mode_has_no_labs_syntax_and_keeps_the_device_for_docker_run() -> None:
    r = _render("qwen3-8b", "h100", mode=BuildMode.TWO_PHASE)
    assert "syntax=" not in r.dockerfile
    assert "RUN --device" not in r.dockerfile
    assert r.device == "nvidia.com/gpu=all"


def test_two_phase_needs_a_device() -> None:
    with pytest.raises(BadInput, match="two-phase build runs the compile step with a CDI device"):
        _render("tiny-llama-torch", "cpu", mode=BuildMode.TWO_PHASE)
    r = _render("tiny-llama-torch", "cpu", mode=BuildMode.TWO_PHASE, device="kernelbake.dev/test=builder")
    assert r.device == "kernelbake.dev/test=builder"


def test_labels_in_the_dockerfile_are_the_planned_ones() -> None:
    target = _target("llama-3.1-8b-instruct", "l40s")
    r = render(target, wheel="kb.whl")
    label_line = next(s for s in _stages(r.dockerfile)["final"] if s.startswith("LABEL "))
    found = dict(re.findall(r'(\S+)="((?:[^"\\]|\\.)*)"', label_line))
    unescaped = {k: v.replace('\\"', '"').replace("\\$", "$").replace("\\\\", "\\") for k, v in found.items()}
    assert unescaped == dict(target.labels)


def test_label_values_cannot_break_out() -> None:
    from kernelbake.render import _dq

    assert _dq('a"b$HOME\\') == '"a\\"b\\$HOME\\\\"'
    with pytest.raises(BadInput, match="line break"):
        _dq("a\nRUN rm -rf /")


def test_target_json_round_trips_the_plan() -> None:
    target = _target("qwen3-8b", "h100")
    r = render(target, wheel="kb.whl")
    config = TargetConfig.from_json(r.target_json)
    assert config.key == target.key
    assert config.gpu == "h100"
    assert config.serve == target.spec.serve


def test_every_gpu_of_every_spec_renders() -> None:
    for path in sorted((REPO / "images").glob("*.yaml")):
        spec = load_spec(path)
        for target in plan(spec, registry="r/kb"):
            r = render(target, wheel="kb.whl")
            assert target.key.digest in r.dockerfile


def test_write_context_lays_out_the_build_context(tmp_path: Path) -> None:
    wheel = tmp_path / "kb.whl"
    wheel.write_bytes(b"wheel")
    r = _render("tiny-llama-torch", "cpu")
    ctx = write_context(r, tmp_path / "ctx", wheel)
    assert sorted(p.relative_to(ctx).as_posix() for p in ctx.rglob("*")) == [
        "Dockerfile",
        "model",
        "model/config.json",
        "model/tokenizer.json",
        "model/tokenizer_config.json",
        "target.json",
        "wheels",
        "wheels/kb.whl",
    ]


def test_target_json_is_written_read_only_for_group_and_others_whatever_the_umask(tmp_path: Path) -> None:
    """serve starts warm only on a target.json no group or other may write (runtime.trusted),
    and COPY keeps the context file's mode."""
    wheel = tmp_path / "kb.whl"
    wheel.write_bytes(b"wheel")
    old = os.umask(0o002)
    try:
        ctx = write_context(_render("tiny-llama-torch", "cpu"), tmp_path / "ctx", wheel)
    finally:
        os.umask(old)
    assert stat.S_IMODE((ctx / "target.json").stat().st_mode) == 0o644


def test_bake_single_mode_targets(tmp_path: Path) -> None:
    r = _render("tiny-llama-torch", "cpu")
    layout = bakefile.Layout(tmp_path / r.target.name)
    targets = bakefile.bake_targets(r, layout, push=False)
    n = r.target.name
    assert [s for s, _ in bakefile.step_names(r)] == ["runtime", "compile", "final"]
    assert targets[f"{n}-runtime"]["output"] == ["type=cacheonly"]
    assert targets[f"{n}-compile"]["target"] == "compile"
    assert targets[n]["tags"] == [r.target.ref] and targets[n]["output"] == ["type=docker"]
    assert "contexts" not in targets[n]
    doc = json.loads(bakefile.dumps(bakefile.bake_document({n: targets})))
    assert doc["group"]["default"]["targets"] == [n]


def test_bake_two_phase_takes_caches_as_a_named_context(tmp_path: Path) -> None:
    r = _render("qwen3-8b", "h100", mode=BuildMode.TWO_PHASE)
    layout = bakefile.Layout(tmp_path / r.target.name)
    targets = bakefile.bake_targets(r, layout, push=True, secrets=[bakefile.HF_TOKEN_SECRET])
    n = r.target.name
    assert set(targets) == {f"{n}-runtime", n}
    assert targets[f"{n}-runtime"]["tags"] == [bakefile.compile_env_ref(r.target)]
    assert targets[n]["contexts"] == {"caches": str(layout.caches)}
    assert targets[n]["output"] == ["type=image,push=true"]
    assert targets[n]["secret"] == ["id=hf_token,env=HF_TOKEN"]


def _criu_prefix(where: Path) -> Path:
    """The shape install.sh leaves: bin/criu, criu.lock, a library linked to its soname."""
    (where / "bin").mkdir(parents=True)
    (where / "bin" / "criu").write_text("#!/bin/sh\n")
    (where / "criu.lock").write_text("criu 4.2.1-1\n")
    (where / "lib").mkdir()
    (where / "lib" / "libx.so.1.0").write_bytes(b"elf")
    (where / "lib" / "libx.so.1").symlink_to("libx.so.1.0")
    return where


def test_a_snapshot_spec_puts_criu_in_the_final_image_before_the_caches(tmp_path: Path) -> None:
    """tiny-llama says ``snapshot: true``: CRIU's prefix is the final stage's first layer (the
    caches and the manifest stay last); a spec without it gets no CRIU."""
    final = _stages(_render("tiny-llama", "cpu").dockerfile)["final"]
    assert final[1] == "COPY criu/ /opt/kernelbake/criu/"
    assert not any("criu" in s for s in _stages(_render("qwen3-8b", "h100").dockerfile)["final"])
    wheel = tmp_path / "kb.whl"
    wheel.write_bytes(b"wheel")
    ctx = write_context(
        _render("tiny-llama", "cpu"), tmp_path / "ctx", wheel, _criu_prefix(tmp_path / "criu")
    )
    assert (ctx / "criu" / "bin" / "criu").is_file() and (ctx / "criu" / "criu.lock").is_file()
    assert (ctx / "criu" / "lib" / "libx.so.1").readlink() == Path("libx.so.1.0")


def test_a_snapshot_spec_without_criu_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from kernelbake.errors import EnvironmentProblem
    from kernelbake.pipeline import BuildOptions, Driver
    from kernelbake.settings import Settings

    wheel = tmp_path / "kb.whl"
    wheel.write_bytes(b"wheel")
    target = _target("tiny-llama", "cpu")
    with pytest.raises(
        EnvironmentProblem, match=r"tiny-llama\.yaml:\d+: snapshot: the image is to carry CRIU"
    ) as e:
        write_context(_render("tiny-llama", "cpu"), tmp_path / "ctx", wheel, tmp_path / "none")
    assert "make criu" in (e.value.hint or "") and not (tmp_path / "ctx").exists()
    # A build says so before it asks Docker anything or writes its out folder.
    settings = Settings(build_dir=tmp_path / "build", docker="/nonexistent/docker")
    with pytest.raises(EnvironmentProblem, match=f"{tmp_path / 'build' / 'criu'} holds no CRIU prefix"):
        Driver(settings).build([target], BuildOptions(out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    # Without ``snapshot: true`` nothing is asked of CRIU.
    ctx = write_context(_render("tiny-llama-torch", "cpu"), tmp_path / "ctx2", wheel)
    assert not (ctx / "criu").exists()
