"""The docs' examples, run: the README's quick start (``docker run`` of the image and a completion
with its ``curl``; the page's other steps run in test_runbooks) and docs/cluster.md's podman
recipe for deploy/examples/serve.yaml, run as the page writes it, against the default image the
integration fixtures build (tiny-llama on vLLM's CPU build). The README's ``$IMAGE`` becomes the
built image and its host port a free one; nothing else is changed."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernelbake.pipeline import Built
from tests.conftest import REPO
from tests.integration.conftest import QuickStart
from tests.support import runbook
from tests.support.podman import pulled
from tests.test_docs import README, blocks

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]

HEALTH_TIMEOUT_S = 900
CLUSTER = REPO / "docs" / "cluster.md"


def _healthy(probe: list[str], alive: Callable[[], bool], what: str, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while subprocess.run(probe, capture_output=True).returncode != 0:
        if not alive() or time.monotonic() > deadline:
            raise AssertionError(f"{what} did not become healthy:\n{log()[-4000:]}")
        time.sleep(2)


# What the README's serve sample shows: kernelbake's lines, those of serve and those of its plugin
# in vLLM's server (the prediction), each kind in its own order (the two processes interleave).
KINDS = ("kernelbake serve:", "kernelbake:")
FILES = re.compile(r"(\d+) files")


def test_the_readme_quick_start_serves_a_completion_as_its_sample_shows(readme_served: QuickStart) -> None:
    """The README's ``docker run`` and ``curl`` (the readme_served fixture); its ``check`` runs in
    test_runbooks[README.md], which checks the verdict the page shows after it."""
    assert "--shm-size=2g" in readme_served.argv
    answer = readme_served.answer
    assert answer["choices"][0]["text"] and answer["usage"]["completion_tokens"] == 4
    # The sample is what a run prints: every line of each kind, none left out, in order, the
    # same words (times, digests and numbers vary). The number of baked files is not the same
    # in every build of the spec (55 on the CI machines, 67 in one build elsewhere, as the page
    # says), so it is checked against the run itself: every file serve found, it checked.
    (sample,) = blocks(README.read_text(), "serve-output")
    printed = readme_served.log.splitlines()
    for kind in KINDS:
        shown = [ln for ln in sample.splitlines() if ln.startswith(kind)]
        said = [ln for ln in printed if ln.startswith(kind)]
        assert len(shown) == len(said), (kind, shown, said)
        for want, got in zip(shown, said, strict=True):
            assert runbook.shown_line(want).fullmatch(got), (want, got)
            assert len(FILES.findall(want)) == len(FILES.findall(got)), (want, got)
    counts = [
        int(n) for ln in printed if ln.startswith("kernelbake serve: baked caches") for n in FILES.findall(ln)
    ]
    assert len(counts) == 2 and counts[0] == counts[1] > 0, counts
    assert any("baked caches valid (exact match)" in ln for ln in printed), printed


def cluster_page_podman_block() -> runbook.Block:
    """docs/cluster.md's podman recipe, as a block to run (the page marks it run here)."""
    (block,) = [
        b for b in runbook.parse(CLUSTER.read_text(), "docs/cluster.md") if "podman kube play" in b.body
    ]
    assert block.kind is runbook.Kind.ELSEWHERE and block.needs == "test_docs_run", block
    return dataclasses.replace(block, kind=runbook.Kind.RUN)


@contextlib.contextmanager
def played(image: str, workdir: Path) -> Iterator[tuple[dict[str, Any], dict[str, str]]]:
    """docs/cluster.md's podman recipe run verbatim in a checkout's shape (``deploy/``, and
    ``build/image.ref`` naming ``image``, as ``make image`` leaves it), with the venv's python3
    first on PATH as the README's set-up line puts it; yields the manifest it wrote and podman's
    environment, then ``kube down``."""
    (workdir / "deploy").symlink_to(REPO / "deploy")
    (workdir / "build").mkdir()
    (workdir / "build" / "image.ref").write_text(image + "\n")
    manifest = workdir / "build" / "serve-cpu.yaml"
    env = {**os.environ, "CONTAINERS_CONF": str(workdir / "build" / "containers.conf")}
    try:
        runbook.run(
            [cluster_page_podman_block()], env=runbook.page_env(Path(sys.prefix) / "bin", {}), cwd=workdir
        )
        yield yaml.safe_load(manifest.read_text()), env
    finally:
        if manifest.is_file():
            subprocess.run(["podman", "kube", "down", str(manifest)], capture_output=True, env=env)
        for volume in ("kernel-cache", "tmp", "shm"):
            subprocess.run(["podman", "volume", "rm", "-f", volume], capture_output=True, env=env)


def test_the_serve_manifest_plays_with_podman_read_only_warm_and_serving(
    vllm_image: Built, tmp_path: Path
) -> None:
    image = pulled(vllm_image)
    with played(image, tmp_path) as (obj, env):
        # What the page's substitutions made of deploy/examples/serve.yaml.
        spec = obj["spec"]["template"]["spec"]
        assert {c["image"] for c in [*spec["initContainers"], *spec["containers"]]} == {image}
        assert "nvidia.com/gpu" not in spec["containers"][0]["resources"]["limits"]
        pod = f"{obj['metadata']['name']}-pod-0"
        ctr = f"{pod}-{spec['containers'][0]['name']}"

        def podman(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["podman", *args], capture_output=True, text=True, env=env)

        def running() -> bool:
            return podman("inspect", "-f", "{{.State.Running}}", ctr).stdout.strip() == "true"

        def logs(name: str = ctr) -> str:
            res = podman("logs", name)
            return res.stdout + res.stderr

        health = "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)"
        _healthy(["podman", "exec", ctr, "python3", "-c", health], running, "the pod", logs)
        body = json.dumps({"model": "/models/tiny-llama", "prompt": "Hello", "max_tokens": 4})
        post = (
            "import sys, urllib.request as u; r = u.Request('http://127.0.0.1:8000/v1/completions', "
            f"data={body!r}.encode(), headers={{'Content-Type': 'application/json'}}); "
            "sys.stdout.write(u.urlopen(r, timeout=300).read().decode())"
        )
        done = podman("exec", ctr, "python3", "-c", post)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["choices"][0]["text"]
        # The init container seeded the emptyDir (podman removes it once it has run; the emptyDir
        # masks the image's own cache root, so what is there is what it copied), every file the
        # manifest lists, and serve used it in place.
        listed = (
            "import json, pathlib; r = pathlib.Path('/opt/kernelbake/cache'); "
            "fs = json.loads((r / 'manifest.json').read_text())['files']; "
            "print(len(fs), sum((r / f['path']).is_file() for f in fs))"
        )
        files, present = podman("exec", ctr, "python3", "-c", listed).stdout.split()
        assert int(files) > 0 and files == present
        lines = [ln for ln in logs().splitlines() if ln.startswith("kernelbake serve:")]
        assert any(
            "baked caches valid (exact match)" in ln and "/opt/kernelbake/cache" in ln for ln in lines
        ), lines
        assert not [ln for ln in lines if "read-only" in ln], lines
        # The root is read-only; the paths the manifest mounts are not.
        touch = podman("exec", ctr, "python3", "-c", "open('/kernelbake-probe', 'w')")
        assert touch.returncode != 0 and "Read-only file system" in touch.stderr
        for path in ("/tmp", "/dev/shm", "/opt/kernelbake/cache"):
            probe = f"import tempfile; tempfile.NamedTemporaryFile(dir={path!r})"
            assert podman("exec", ctr, "python3", "-c", probe).returncode == 0, path
        # The page's stop, as it writes it (no containers.conf: nothing is started).
        down = subprocess.run(
            ["podman", "kube", "down", "build/serve-cpu.yaml"], cwd=tmp_path, capture_output=True, text=True
        )
        assert down.returncode == 0, down.stdout + down.stderr
        assert subprocess.run(["podman", "pod", "exists", pod], capture_output=True).returncode == 1
