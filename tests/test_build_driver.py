"""The build driver with a recording runner: stage order, failures, push rules. No Docker."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kernelbake.build import BuildOptions, Driver, Publish
from kernelbake.contract.artifact import CacheArtifactFacts, EngineImage, artifact_ref
from kernelbake.errors import BadInput, BuildFailed, EnvironmentProblem
from kernelbake.oci.types import sha256_digest
from kernelbake.plan import BuildTarget, plan
from kernelbake.render import BuildMode, engine_env
from kernelbake.runner import Result
from kernelbake.settings import Settings
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.recorder import Recorder


@pytest.fixture
def target() -> BuildTarget:
    (t,) = plan(load_spec(REPO / "images" / "tiny-llama-torch.yaml"), ["cpu"], registry="127.0.0.1:5999/kb")
    return t


def _driver(rec: Recorder) -> Driver:
    return Driver(Settings.from_env({"PATH": "/usr/bin"}), runner=rec)


def _bake_targets(rec: Recorder) -> list[str]:
    return [c[-1] for c in rec.calls if c[:2] == ("buildx", "bake")]


def test_single_mode_builds_stage_by_stage_and_verifies_labels(target: BuildTarget, tmp_path: Path) -> None:
    rec = Recorder(labels=dict(target.labels))
    (built,) = _driver(rec).build([target], BuildOptions(out=tmp_path))
    n = target.name
    assert _bake_targets(rec) == [f"{n}-runtime", f"{n}-compile", n]
    assert built.ref == target.ref and built.pushed is None
    assert not any(c[0] == "push" for c in rec.calls)
    assert (tmp_path / n / "context" / "Dockerfile").is_file()
    assert (tmp_path / "docker-bake.json").is_file()
    assert [p.name for p in rec.logs] == ["runtime.log", "compile.log", "final.log"]


def test_push_happens_last_and_reports_the_digest(
    target: BuildTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    rec = Recorder(labels=dict(target.labels))
    (built,) = _driver(rec).build([target], BuildOptions(out=tmp_path, push=True))
    pushes = [i for i, c in enumerate(rec.calls) if c[0] == "push"]
    bakes = [i for i, c in enumerate(rec.calls) if c[:2] == ("buildx", "bake")]
    assert len(pushes) == 1 and pushes[0] > max(bakes)
    assert built.pushed == f"{target.repository}@sha256:{'ab' * 32}"


@pytest.mark.parametrize(
    ("suffix", "stage"), [("-runtime", "runtime"), ("-compile", "compile"), ("", "final")]
)
def test_a_failing_stage_is_named_with_its_log_and_nothing_is_pushed(
    target: BuildTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str, stage: str
) -> None:
    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    rec = Recorder(fail_bake=target.name + suffix, labels=dict(target.labels))
    with pytest.raises(BuildFailed) as info:
        _driver(rec).build([target], BuildOptions(out=tmp_path, push=True))
    log = tmp_path / target.name / "logs" / f"{stage}.log"
    assert f"stage {stage!r}" in str(info.value) and str(log) in str(info.value)
    assert "nothing was pushed" in str(info.value)
    assert not any(c[0] == "push" for c in rec.calls)


def test_label_mismatch_is_not_pushed(
    target: BuildTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    other = target.key.replace(torch="2.12.0")
    rec = Recorder(labels={**dict(target.labels), **other.labels()})
    with pytest.raises(BuildFailed, match="differ from the planned key; not pushing"):
        _driver(rec).build([target], BuildOptions(out=tmp_path, push=True))
    assert not any(c[0] == "push" for c in rec.calls)


def test_without_buildx_falls_back_to_docker_build(target: BuildTarget, tmp_path: Path) -> None:
    rec = Recorder(buildx=False, labels=dict(target.labels))
    _driver(rec).build([target], BuildOptions(out=tmp_path))
    builds = [c for c in rec.calls if c[0] == "build"]
    assert [c[c.index("--target") + 1] for c in builds] == ["runtime", "compile", "final"]
    assert "-t" in builds[-1] and target.ref in builds[-1]


def test_two_phase_needs_buildx(target: BuildTarget, tmp_path: Path) -> None:
    rec = Recorder(buildx=False)
    with pytest.raises(EnvironmentProblem, match="needs docker buildx"):
        _driver(rec).build(
            [target],
            BuildOptions(out=tmp_path, mode=BuildMode.TWO_PHASE, device="kernelbake.dev/test=builder"),
        )


def test_two_phase_compiles_with_docker_run_device_into_the_named_context(
    target: BuildTarget, tmp_path: Path
) -> None:
    rec = Recorder(labels=dict(target.labels))
    options = BuildOptions(out=tmp_path, mode=BuildMode.TWO_PHASE, device="kernelbake.dev/test=builder")
    _driver(rec).build([target], options)
    n = target.name
    runs = [c for c in rec.calls if c[0] == "run"]
    assert len(runs) == 1
    run = runs[0]
    assert run[run.index("--device") + 1] == "kernelbake.dev/test=builder"
    assert run[run.index("-v") + 1] == f"{tmp_path / n / 'caches'}:/opt/kernelbake/cache"
    assert run[-3:-1] == ("compile", "--chown")
    order = [
        c[-1] if c[0] == "buildx" else "run"
        for c in rec.calls
        if c[0] in ("run",) or c[:2] == ("buildx", "bake")
    ]
    assert order == [f"{n}-runtime", "run", n]


def test_render_cli_handles_vllm_gpu_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernelbake.cli import main

    assert (
        main(["render", str(REPO / "images" / "qwen3-8b.yaml"), "--gpu", "h100", "--out", str(tmp_path)]) == 0
    )
    dockerfile = (tmp_path / "qwen3-8b-h100" / "context" / "Dockerfile").read_text()
    assert "RUN --device=nvidia.com/gpu=all python3 -m kernelbake compile" in dockerfile
    assert 'VLLM_CACHE_ROOT="/opt/kernelbake/cache/vllm"' in dockerfile
    for kind in ("vllm", "inductor", "triton", "flashinfer"):
        assert f"COPY --from=caches /{kind}/ /opt/kernelbake/cache/{kind}/" in dockerfile
    assert not (tmp_path / "qwen3-8b-h100" / "context" / "model").exists()
    assert (tmp_path / "docker-bake.json").is_file()


def test_gpu_target_on_its_family_builder_is_pushed_by_the_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    (t,) = plan(load_spec(REPO / "images" / "qwen3-8b.yaml"), ["h100"], registry="ghcr.io/acme/models")
    rec = Recorder(builders=("kernelbake-hopper",))
    (built,) = _driver(rec).build([t], BuildOptions(out=tmp_path, push=True))
    bakes = [c for c in rec.calls if c[:2] == ("buildx", "bake")]
    assert all(c[c.index("--builder") + 1] == "kernelbake-hopper" for c in bakes)
    assert [c[-1] for c in bakes] == [f"{t.name}-runtime", f"{t.name}-compile", t.name]
    assert built.pushed == f"ghcr.io/acme/models/qwen3-8b@sha256:{'cd' * 32}"
    # The builder pushed the complete image itself; no docker push, no image loaded.
    assert not any(c[0] in ("push", "image") for c in rec.calls)
    import json

    doc = json.loads((tmp_path / "docker-bake.json").read_text())
    assert doc["target"][t.name]["output"] == ["type=image,push=true"]


def _gpu_targets(*gpus: str) -> list[BuildTarget]:
    return plan(load_spec(REPO / "images" / "qwen3-8b.yaml"), list(gpus), registry="127.0.0.1:5999/kb")


def test_gpu_families_build_at_once_and_one_familys_targets_queue_on_its_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    targets = _gpu_targets("h100", "h200", "a100-80gb")
    rec = Recorder(
        contexts=("kernelbake-hopper", "kernelbake-ampere"),
        labels_by_ref={t.ref: dict(t.labels) for t in targets},
        bake_seconds=0.2,
    )
    stream = io.StringIO()
    built = Driver(Settings.from_env({"PATH": "/usr/bin"}), runner=rec, stream=stream).build(
        targets, BuildOptions(out=tmp_path, push=True)
    )
    assert [b.target.gpu.name for b in built] == ["h100", "h200", "a100-80gb"]
    assert all(b.pushed and b.pushed.endswith("ab" * 32) for b in built)
    # Every command of a target went to its family's daemon.
    for args, context in zip(rec.calls, rec.context_of, strict=True):
        if args[:2] == ("buildx", "bake") or args[0] == "push":
            family = "ampere" if "a100" in " ".join(args) else "hopper"
            assert context == f"kernelbake-{family}", args
    spans = {name: (a, b) for name, a, b in rec.spans}
    h100, h200, a100 = (t.name for t in targets)
    # Hopper's two targets one after the other, Ampere's beside them.
    assert spans[f"{h200}-runtime"][0] >= spans[h100][1]
    assert spans[f"{a100}-runtime"][0] < spans[h100][1]
    text = stream.getvalue()
    assert f"kernelbake build: {h100}: stage compile (log {tmp_path / h100 / 'logs' / 'compile.log'})" in text
    table = text[text.index("target  ") :].splitlines()
    assert len(table) == 4 and all(" pushed " in row for row in table[1:])


def test_a_failing_target_stops_no_other_and_nothing_of_it_is_pushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    targets = _gpu_targets("h100", "a100-80gb")
    bad, good = targets[0], targets[1]
    rec = Recorder(
        fail_bake=f"{bad.name}-compile",
        labels_by_ref={t.ref: dict(t.labels) for t in targets},
        contexts=("kernelbake-hopper", "kernelbake-ampere"),
    )
    stream = io.StringIO()
    with pytest.raises(BuildFailed) as info:
        Driver(Settings.from_env({"PATH": "/usr/bin"}), runner=rec, stream=stream).build(
            targets, BuildOptions(out=tmp_path, push=True, max_parallel=1)
        )
    message = str(info.value)
    assert f"1 of 2 targets failed: {bad.name}: stage 'compile'" in message
    assert f"built: {good.name}" in message and "no index" in message
    pushes = [c for c in rec.calls if c[0] == "push"]
    assert pushes == [("push", good.ref)]
    assert re.search(rf"^{bad.name} +FAILED ", stream.getvalue(), re.M)


def test_max_parallel_must_be_positive(target: BuildTarget, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="at least 1"):
        _driver(Recorder()).build([target], BuildOptions(out=tmp_path, max_parallel=0))


@pytest.mark.parametrize("mode", [BuildMode.SINGLE, BuildMode.TWO_PHASE])
def test_a_gpu_target_without_its_familys_builder_fails_before_anything_builds(
    tmp_path: Path, mode: BuildMode
) -> None:
    (t,) = _gpu_targets("h100")
    rec = Recorder()
    with pytest.raises(EnvironmentProblem) as info:
        _driver(rec).build([t], BuildOptions(out=tmp_path, push=True, mode=mode))
    message = str(info.value)
    assert info.value.return_code == 3
    assert "kernelbake-hopper (for h100, CDI device nvidia.com/gpu=all)" in message
    assert "buildkit/setup-builder.sh hopper" in message and "\n" not in message
    # Nothing was built, pulled or pushed, and no registry was asked (no ping patched here).
    assert not any(c[:2] == ("buildx", "bake") or c[0] in ("build", "run", "push", "pull") for c in rec.calls)
    assert not (tmp_path / "wheels").exists()


def test_every_family_without_a_builder_is_named_at_once(tmp_path: Path) -> None:
    targets = _gpu_targets("h100", "a100-80gb", "l40s")
    rec = Recorder(contexts=("kernelbake-ampere",))
    with pytest.raises(EnvironmentProblem) as info:
        _driver(rec).build(targets, BuildOptions(out=tmp_path, device="nvidia.com/gpu=0"))
    message = str(info.value)
    assert "kernelbake-hopper (for h100, CDI device nvidia.com/gpu=0)" in message
    assert "kernelbake-ada-lovelace (for l40s" in message and "kernelbake-ampere" not in message
    assert "buildkit/setup-builder.sh hopper nvidia.com/gpu=0" in message


def test_what_a_builder_still_has_to_pull_is_said_before_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    (t,) = _gpu_targets("h100")

    class NoBase(Recorder):
        def __call__(self, argv, **kw):  # type: ignore[no-untyped-def]
            if list(argv[-4:]) == ["inspect", "--format", "{{.Id}}", t.base_image]:
                return Result(tuple(argv), 1)
            return super().__call__(argv, **kw)

    rec = NoBase(contexts=("kernelbake-hopper",), labels=dict(t.labels))
    stream = io.StringIO()
    Driver(Settings.from_env({"PATH": "/usr/bin"}), runner=rec, stream=stream).build(
        [t], BuildOptions(out=tmp_path, mode=BuildMode.TWO_PHASE)
    )
    first = stream.getvalue().splitlines()[0]
    assert first == (
        f"kernelbake build: docker context kernelbake-hopper will pull: base image {t.base_image} "
        "(not in its image store)"
    )
    stream = io.StringIO()
    Driver(
        Settings.from_env({"PATH": "/usr/bin"}),
        runner=Recorder(builders=("kernelbake-hopper",), labels=dict(t.labels)),
        stream=stream,
    ).build([t], BuildOptions(out=tmp_path))
    assert (
        "kernelbake build: buildx builder kernelbake-hopper will pull: "
        "Dockerfile frontend docker/dockerfile:1-labs (unless BuildKit has it cached)\n"
    ) in stream.getvalue()


def test_cpu_and_stand_in_targets_build_on_this_daemon_without_a_family_builder(
    target: BuildTarget, tmp_path: Path
) -> None:
    import io

    rec = Recorder(labels=dict(target.labels))
    stream = io.StringIO()
    Driver(Settings.from_env({"PATH": "/usr/bin"}), runner=rec, stream=stream).build(
        [target], BuildOptions(out=tmp_path)
    )
    assert "will pull" not in stream.getvalue()
    assert _bake_targets(rec)[-1] == target.name


# -- the cache-only artifact ----------------------------------------------------------------


def _artifact_setup(target: BuildTarget, tmp_path: Path) -> tuple[Recorder, CacheArtifactFacts]:
    """A recorder for a build that publishes the artifact: the caches directory the export
    would write, the engine image's inspect output and the image's engine command."""
    manifest = b'{"schema": 1}\n'
    caches = tmp_path / target.name / "caches"
    caches.mkdir(parents=True)
    (caches / "manifest.json").write_bytes(manifest)
    engine = EngineImage(
        name=target.base_image, config_digest="sha256:" + "1" * 64, digest="sha256:" + "2" * 64
    )
    command = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/x"]
    facts = CacheArtifactFacts(
        engine=engine,
        manifest_digest=sha256_digest(manifest),
        command=tuple(command),
        env=tuple(sorted({"VLLM_WORKER_MULTIPROC_METHOD": "fork", **dict(engine_env(target))}.items())),
    )
    rec = Recorder(
        labels_by_ref={
            target.ref: dict(target.labels),
            artifact_ref(target.ref): {**dict(target.labels), **facts.labels()},
        },
        stdout_for={
            "image inspect --format {{json .}}": json.dumps(
                {"Id": engine.config_digest, "RepoDigests": [f"elsewhere/vllm@{engine.digest}"]}
            ),
            "run --rm --network none --entrypoint python3": json.dumps(
                {"command": command, "env": {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}}
            ),
        },
    )
    return rec, facts


def test_publish_cache_builds_the_artifact_from_the_exported_caches_and_pushes_only_it(
    target: BuildTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    rec, facts = _artifact_setup(target, tmp_path)
    (built,) = _driver(rec).build([target], BuildOptions(out=tmp_path, push=True, publish=Publish.CACHE))
    n = target.name
    assert _bake_targets(rec) == [f"{n}-runtime", f"{n}-compile", n, f"{n}-caches", f"{n}-cache-artifact"]
    bake_file = json.loads((tmp_path / "docker-bake.json").read_text())
    assert bake_file["target"][f"{n}-caches"]["output"] == [f"type=local,dest={tmp_path / n / 'caches'}"]
    art = json.loads((tmp_path / n / "artifact-bake.json").read_text())["target"][f"{n}-cache-artifact"]
    assert art["target"] == "cache-artifact" and art["contexts"] == {"caches": str(tmp_path / n / "caches")}
    assert art["labels"] == facts.labels() and art["tags"] == [artifact_ref(target.ref)]
    assert built.pushed is None and built.cache is not None and built.cache.facts == facts
    assert [c[1] for c in rec.calls if c[0] == "push"] == [artifact_ref(target.ref)]
    assert built.published == [built.cache.pushed]


def _bake_paths(bake_file: Path, bake_target: str) -> list[Path]:
    """What a bake of ``bake_target`` reads or writes on this machine: its context, its named
    contexts and a local output's destination."""
    spec = json.loads(bake_file.read_text())["target"][bake_target]
    paths = [spec["context"], *spec.get("contexts", {}).values()]
    paths += [o.partition("dest=")[2] for o in spec.get("output", []) if "dest=" in o]
    return [Path(p) for p in paths]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"mode": BuildMode.TWO_PHASE, "device": "kernelbake.dev/test=builder"},
        {"push": True, "publish": Publish.BOTH},
    ],
    ids=["single", "two-phase", "cache-artifact"],
)
def test_every_bake_runs_where_its_paths_are_so_new_buildx_needs_no_fs_grant(
    target: BuildTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, object]
) -> None:
    """buildx 0.20+ refuses a bake touching paths outside its working directory without
    ``--allow=fs.*`` (which 0.13 lacks): each bake starts in a folder that holds all of them."""
    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    rec, _ = _artifact_setup(target, tmp_path)
    _driver(rec).build([target], BuildOptions(out=tmp_path, **options))  # type: ignore[arg-type]
    bakes = [(c, cwd) for c, cwd in zip(rec.calls, rec.cwd_of, strict=True) if c[:2] == ("buildx", "bake")]
    assert bakes
    for call, cwd in bakes:
        assert cwd is not None, call
        bake_file = Path(call[call.index("-f") + 1])
        for path in [bake_file, *_bake_paths(bake_file, call[-1])]:
            assert path.is_absolute() and path.is_relative_to(cwd), (call[-1], path, cwd)


def test_an_artifact_whose_labels_differ_from_the_record_is_not_pushed(
    target: BuildTarget, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kernelbake.oci.RegistryClient.ping", lambda self, ref: None)
    rec, _facts = _artifact_setup(target, tmp_path)
    assert rec.labels_by_ref is not None
    rec.labels_by_ref = {**rec.labels_by_ref, artifact_ref(target.ref): {**dict(target.labels)}}
    with pytest.raises(BuildFailed, match="artifact's labels differ"):
        _driver(rec).build([target], BuildOptions(out=tmp_path, push=True, publish=Publish.BOTH))
    # The image was pushed before the artifact was built; the artifact never was.
    assert [c[1] for c in rec.calls if c[0] == "push"] == [target.ref]


def test_a_build_without_the_caches_manifest_names_it(target: BuildTarget, tmp_path: Path) -> None:
    rec, _ = _artifact_setup(target, tmp_path)
    (tmp_path / target.name / "caches" / "manifest.json").unlink()
    with pytest.raises(BuildFailed, match=r"manifest\.json is missing after compile"):
        _driver(rec).build([target], BuildOptions(out=tmp_path, publish=Publish.CACHE))
