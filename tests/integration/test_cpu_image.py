"""The torch engine's tiny-llama CPU image (tiny-llama-torch.yaml) for real: build, push, pull, run; cache hits and cold fallback."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest

from kernelbake.cli import main
from kernelbake.contract.key import parse_key
from kernelbake.oci import RegistryClient, parse_reference
from kernelbake.pipeline import Built
from kernelbake.remote import inspect_remote
from tests.conftest import REPO
from tests.support.docker import docker, ready_line
from tests.support.podman import ULIMITS, podman, pull, require_podman
from tests.support.registry import free_port

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]


def test_pulled_image_hits_the_baked_inductor_cache(single_image: Built) -> None:
    assert single_image.pushed is not None
    # Drop the local copy so that what runs is what the registry serves.
    docker("image", "rm", single_image.ref)
    docker("pull", single_image.pushed)
    res = docker("run", "--rm", single_image.pushed, "--warmup-only")
    assert "baked caches valid (exact match)" in res.stderr
    counters = ready_line(res.stdout)["counters"]
    assert counters["fxgraph_cache_hit"] >= 1 and counters["fxgraph_cache_miss"] == 0
    assert counters["autograd_cache_hit"] >= 1 and counters["autograd_cache_miss"] == 0


def _baked_files(image: str, tmp_path: Path) -> tuple[Path, Path]:
    target = json.loads(
        docker("run", "--rm", "--entrypoint", "cat", image, "/opt/kernelbake/target.json").stdout
    )
    manifest = json.loads(
        docker("run", "--rm", "--entrypoint", "cat", image, "/opt/kernelbake/cache/manifest.json").stdout
    )
    # A consistent bundle that claims another torch: as if baked with a different base image.
    other = str(parse_key(target["key"]).replace(torch="2.12.0"))
    target["key"] = manifest["key"] = other
    (tmp_path / "target.json").write_text(json.dumps(target))
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    return tmp_path / "target.json", tmp_path / "manifest.json"


def test_mismatched_key_falls_back_to_a_clean_cold_start(single_image: Built, tmp_path: Path) -> None:
    assert single_image.pushed is not None
    target, manifest = _baked_files(single_image.pushed, tmp_path)
    res = docker(
        "run",
        "--rm",
        "-v",
        f"{target}:/opt/kernelbake/target.json:ro",
        "-v",
        f"{manifest}:/opt/kernelbake/cache/manifest.json:ro",
        single_image.pushed,
        "--warmup-only",
    )
    assert "WARNING: starting COLD" in res.stderr
    assert (
        "torch: baked '2.12.0', found '2.13.0' (Inductor caches are keyed by the torch version)" in res.stderr
    )
    assert "Traceback" not in res.stderr
    counters = ready_line(res.stdout)["counters"]
    assert counters["fxgraph_cache_hit"] == 0 and counters["fxgraph_cache_miss"] >= 1


def _tampered_kernel(image: str, tmp_path: Path) -> tuple[list[str], str, str]:
    """A compiled kernel of the image with one byte flipped, and the ``-v`` that mounts it
    over the baked one; with the file's path and its recorded sha256."""
    manifest = json.loads(
        docker("run", "--rm", "--entrypoint", "cat", image, "/opt/kernelbake/cache/manifest.json").stdout
    )
    entry = next(f for f in manifest["files"] if f["path"].endswith(".so"))
    local = tmp_path / "tampered.so"
    cid = docker("create", image).stdout.strip()
    try:
        docker("cp", f"{cid}:/opt/kernelbake/cache/{entry['path']}", str(local))
    finally:
        docker("rm", cid, check=False)
    data = bytearray(local.read_bytes())
    data[len(data) // 2] ^= 0x01
    local.write_bytes(bytes(data))
    return ["-v", f"{local}:/opt/kernelbake/cache/{entry['path']}:ro"], entry["path"], entry["sha256"]


def test_a_flipped_byte_in_a_baked_kernel_is_never_loaded(single_image: Built, tmp_path: Path) -> None:
    assert single_image.pushed is not None
    mount, path, recorded = _tampered_kernel(single_image.pushed, tmp_path)
    res = docker("run", "--rm", *mount, single_image.pushed, "--warmup-only")
    assert "WARNING: starting COLD" in res.stderr and "Traceback" not in res.stderr
    assert re.search(
        rf"cache integrity: {re.escape(path)}: sha256 [0-9a-f]{{64}} but the manifest records {recorded}$",
        res.stderr,
        re.MULTILINE,
    )
    counters = ready_line(res.stdout)["counters"]
    assert counters["fxgraph_cache_hit"] == 0 and counters["fxgraph_cache_miss"] >= 1
    check = ["--entrypoint", "python3", single_image.pushed, "-m", "kernelbake", "check"]
    assert docker("run", "--rm", *mount, *check, check=False).returncode == 6
    # Only the mode named unsafe lets it through, and it says so.
    unsafe = docker("run", "--rm", *mount, "-e", "KERNELBAKE_VERIFY=unsafe-size-only", *check, check=False)
    assert unsafe.returncode == 0, unsafe.stdout + unsafe.stderr
    assert "WARNING: UNSAFE: KERNELBAKE_VERIFY=unsafe-size-only" in unsafe.stdout


def _consistent_tampering(image: str, tmp_path: Path) -> tuple[Path, str]:
    """The image's /opt/kernelbake copied out, one compiled kernel changed, and the cache
    manifest and its pinned copy rewritten to match: everything agrees with everything, so only
    where the files come from tells them apart. Returns the copy and the changed file's path."""
    cid = docker("create", image).stdout.strip()
    try:
        docker("cp", f"{cid}:/opt/kernelbake", str(tmp_path))
    finally:
        docker("rm", cid, check=False)
    trust = tmp_path / "kernelbake"
    doc = json.loads((trust / "cache" / "manifest.json").read_text())
    entry = next(f for f in doc["files"] if f["path"].endswith(".so"))
    kernel = trust / "cache" / entry["path"]
    data = bytearray(kernel.read_bytes())
    data[len(data) // 2] ^= 0x01
    kernel.write_bytes(bytes(data))
    entry["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    (trust / "cache" / "manifest.json").write_text(text)
    (trust / "pinned-manifest.json").write_text(text)
    return trust, entry["path"]


def test_a_consistent_tampering_mounted_over_what_serve_trusts_is_never_warm(
    single_image: Built, tmp_path: Path
) -> None:
    """Issue 32, item 4, with real mounts: a volume at /opt/kernelbake, and the tampered kernel,
    its manifest and a file over pinned-manifest.json, each agreeing with the others. Both
    started warm before; now serve names the mount point and starts cold."""
    assert single_image.pushed is not None
    trust, path = _consistent_tampering(single_image.pushed, tmp_path)
    check = ["--entrypoint", "python3", single_image.pushed, "-m", "kernelbake", "check", "--json"]
    whole = docker("run", "--rm", "-v", f"{trust}:/opt/kernelbake:ro", *check, check=False)
    verdict = json.loads(whole.stdout)
    assert whole.returncode == 6 and verdict["verdict"] == "cold", whole.stdout + whole.stderr
    assert verdict["problems"] == [
        "/opt/kernelbake is a mount point (/proc/self/mountinfo), so /opt/kernelbake/target.json and "
        "/opt/kernelbake/pinned-manifest.json come from what the pod mounted there, not from the image; "
        "mount nothing at or above them (the caches' volume belongs at the cache root)"
    ]
    files = [
        ("pinned-manifest.json", "/opt/kernelbake/pinned-manifest.json"),
        ("cache/manifest.json", "/opt/kernelbake/cache/manifest.json"),
        (f"cache/{path}", f"/opt/kernelbake/cache/{path}"),
    ]
    mounts = [f for rel, at in files for f in ("-v", f"{trust / rel}:{at}:ro")]
    over = docker("run", "--rm", *mounts, *check, check=False)
    verdict = json.loads(over.stdout)
    assert over.returncode == 6 and verdict["verdict"] == "cold", over.stdout + over.stderr
    assert [p.split(" (")[0] for p in verdict["problems"]] == [
        "/opt/kernelbake/pinned-manifest.json is a mount point"
    ]


def test_a_read_only_image_volume_at_the_trusted_directory_is_never_warm(
    single_image: Built, tmp_path: Path
) -> None:
    """The same consistent tampering as an image of its own, mounted by podman as Kubernetes
    mounts an image volume (read-only, ``--mount type=image``) at /opt/kernelbake."""
    require_podman()
    assert single_image.pushed is not None
    _consistent_tampering(single_image.pushed, tmp_path)
    (tmp_path / "Containerfile").write_text("FROM scratch\nCOPY kernelbake/ /\n")
    attack = "localhost/kernelbake-test-attack:trusted-dir"
    podman("build", "--quiet", "-t", attack, "-f", str(tmp_path / "Containerfile"), str(tmp_path))
    try:
        pull(single_image.pushed)
        res = podman(
            "run", "--rm", *ULIMITS,
            "--mount", f"type=image,source={attack},destination=/opt/kernelbake",
            "--entrypoint", "python3", single_image.pushed, "-m", "kernelbake", "check", "--json",
            check=False,
        )  # fmt: skip
    finally:
        podman("rmi", "-f", attack, check=False)
    verdict = json.loads(res.stdout)
    assert res.returncode == 6 and verdict["verdict"] == "cold", res.stdout + res.stderr
    assert verdict["problems"][0].startswith("/opt/kernelbake is a mount point (/proc/self/mountinfo), so ")


def test_the_torch_server_stops_at_a_cache_gate_nobody_answers(single_image: Built) -> None:
    # The gate sits after the imports and the model's construction, before the first compile.
    assert single_image.pushed is not None
    res = docker(
        "run",
        "--rm",
        "-e",
        "KERNELBAKE_CACHE_GATE=/tmp/no-such-gate/verdict",
        "-e",
        "KERNELBAKE_CACHE_GATE_OWNER=999999",
        "--entrypoint",
        "python3",
        single_image.pushed,
        "-m",
        "kernelbake.runtime.engines.torch_serve",
        "--warmup-only",
        check=False,
    )
    assert res.returncode == 6
    assert "is gone; not opening the baked caches" in res.stderr
    assert '"event": "ready"' not in res.stdout and "Traceback" not in res.stderr


def test_read_only_root_with_a_volume_at_the_cache_path_stays_warm(single_image: Built) -> None:
    assert single_image.pushed is not None
    res = docker(
        "run",
        "--rm",
        "--read-only",
        "-v",
        "/opt/kernelbake/cache",
        "--tmpfs",
        "/tmp:exec",
        single_image.pushed,
        "--warmup-only",
    )
    assert "engine caches at /opt/kernelbake/cache" in res.stderr
    assert ready_line(res.stdout)["counters"]["fxgraph_cache_hit"] >= 1


def test_check_reports_a_warm_verdict(single_image: Built) -> None:
    assert single_image.pushed is not None
    res = docker(
        "run", "--rm", "--entrypoint", "python3", single_image.pushed, "-m", "kernelbake", "check", "--json"
    )
    verdict = json.loads(res.stdout)
    assert verdict["verdict"] == "warm" and verdict["match"] == "exact match"
    assert verdict["found"]["device"] == "cpu" and verdict["found"]["torch"] == "2.13.0"


def test_docker_run_image_check_runs_check_through_the_entrypoint(single_image: Built) -> None:
    """The README's ``docker run --rm IMAGE check --json``: the entrypoint is ``kernelbake
    serve``, and a kernelbake command after it runs that command, not the engine."""
    assert single_image.pushed is not None
    res = docker("run", "--rm", single_image.pushed, "check", "--json")
    assert json.loads(res.stdout)["verdict"] == "warm"
    stray = docker("run", "--rm", single_image.pushed, "some-model", check=False)
    assert stray.returncode == 2 and "'some-model' is neither an option nor a command" in stray.stderr


def test_serves_http(single_image: Built) -> None:
    assert single_image.pushed is not None
    port = free_port()
    cid = docker("run", "-d", "--rm", "-p", f"127.0.0.1:{port}:8000", single_image.pushed).stdout.strip()
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        body = json.dumps({"input_ids": [[1, 2, 3, 4]], "max_new_tokens": 3}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/generate", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=120) as r:
            out = json.loads(r.read())
        assert len(out["output_ids"][0]) == 3
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
            assert json.loads(r.read())["counters"]["fxgraph_cache_hit"] >= 1
    finally:
        docker("rm", "-f", cid, check=False)


def _layer_files(client: RegistryClient, image: str, digest: str) -> list[str]:
    blob = client.get_blob(parse_reference(image), digest)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
        return sorted(m.name for m in tar.getmembers() if m.isfile())


def test_layers_end_with_one_per_cache_kind_then_the_manifest(single_image: Built) -> None:
    assert single_image.pushed is not None
    client = RegistryClient()
    layers = inspect_remote(single_image.pushed, client=client).layers
    assert _layer_files(client, single_image.pushed, layers[-1]) == ["opt/kernelbake/cache/manifest.json"]
    assert _layer_files(client, single_image.pushed, layers[-2]) == []  # triton: empty on the CPU
    inductor = _layer_files(client, single_image.pushed, layers[-3])
    assert inductor and all(f.startswith("opt/kernelbake/cache/inductor/") for f in inductor)
    # The manifest's pinned copy, outside the cache root, below the cache layers.
    assert _layer_files(client, single_image.pushed, layers[-4]) == ["opt/kernelbake/pinned-manifest.json"]
    model = _layer_files(client, single_image.pushed, layers[-5])
    assert model == [
        "models/tiny-llama/config.json",
        "models/tiny-llama/tokenizer.json",
        "models/tiny-llama/tokenizer_config.json",
    ]
    assert _layer_files(client, single_image.pushed, layers[-6]) == ["opt/kernelbake/target.json"]


def test_inspect_shows_key_and_cache_manifest(
    single_image: Built, capsys: pytest.CaptureFixture[str]
) -> None:
    assert single_image.pushed is not None
    assert main(["inspect", single_image.pushed, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["key"] == str(single_image.target.key)
    assert doc["pullable"] == single_image.pushed
    cm = doc["cache_manifest"]
    assert cm["key_matches_labels"] and cm["files"] > 0 and cm["kinds"]["inductor"]["files"] > 0
    assert cm["builder"]["device"] == "cpu" and cm["builder"]["driver"] == "none"


def test_a_failing_stage_is_named_and_nothing_is_pushed(
    registry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = REPO / "tests" / "specs" / "missing-base.yaml"
    rc = main(["build", str(spec), "--push", f"{registry}/failing", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    log = tmp_path / "missing-base-cpu" / "logs" / "runtime.log"
    assert rc == 4
    assert err.startswith("kernelbake build: error: missing-base-cpu: stage 'runtime'")
    assert str(log) in err and log.is_file()
    with urllib.request.urlopen(f"http://{registry}/v2/_catalog") as r:
        assert not any(repo.startswith("failing/") for repo in json.loads(r.read())["repositories"])


USER_SCRIPT = """
from kernelbake.runtime.serve.scripts import use_baked_caches
verdict = use_baked_caches()
import json, torch, transformers
from torch._dynamo.utils import counters
config = transformers.AutoConfig.from_pretrained("/models/tiny-llama")
model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
for layer in model.model.layers:
    layer.compile()
with torch.inference_mode():
    model(input_ids=torch.randint(0, config.vocab_size, (1, 32)), use_cache=False)
print(json.dumps({"warm": verdict.warm, **counters["inductor"]}))
"""


def test_users_own_torch_compile_hits_the_baked_caches(single_image: Built) -> None:
    assert single_image.pushed is not None
    res = docker("run", "--rm", "--entrypoint", "python3", single_image.pushed, "-c", USER_SCRIPT)
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["warm"] is True
    assert doc["fxgraph_cache_hit"] >= 1 and doc.get("fxgraph_cache_miss", 0) == 0


def test_inductor_is_asked_for_its_factors_in_the_image(
    single_image: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inductor's real answers (asked inside the image, where torch is) decide the prediction:
    the same factors hit, a changed Inductor option is named as the miss."""
    import dataclasses

    from kernelbake.plan import plan
    from kernelbake.render import target_config
    from kernelbake.runtime.engines import torch_engine
    from kernelbake.runtime.engines.torch_engine import TorchEngine
    from kernelbake.spec import load_spec

    probe = "import json; from kernelbake.runtime.engines.torch_engine import inductor_identity as i; print(json.dumps(i()))"
    res = docker("run", "--rm", "--entrypoint", "python3", single_image.ref, "-c", probe)
    asked = json.loads(res.stdout.strip().splitlines()[-1])
    assert asked["torch_key"] and asked["system"] and "max_autotune" in asked["config"]
    (t,) = plan(load_spec(REPO / "images" / "tiny-llama-torch.yaml"), ["cpu"])
    target = dataclasses.replace(target_config(t), cache_root=str(tmp_path))
    monkeypatch.setattr(torch_engine, "inductor_identity", lambda: asked)

    def bake(identity: dict[str, object]) -> None:
        manifest = {
            "compile_report": {"engine_identity": identity},
            "files": [{"path": "inductor/x", "kind": "inductor", "size": 1, "sha256": "0"}],
        }
        (tmp_path / "manifest.json").write_text(json.dumps(manifest))

    bake(asked)
    hit = TorchEngine().predict(target, [], {})
    assert hit is not None and hit.hit
    flipped = "True" if asked["config"]["max_autotune"] == "False" else "False"
    bake({**asked, "config": {**asked["config"], "max_autotune": flipped}})
    miss = TorchEngine().predict(target, [], {})
    assert miss is not None and not miss.hit
    assert [c.factor for c in miss.kind("inductor").changes] == ["inductor.config.max_autotune"]  # type: ignore[union-attr]
