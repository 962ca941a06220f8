"""The docs' examples, run: the README's quick start (``docker run`` of the image and a completion
with its ``curl``; the page's other steps run in test_runbooks) and docs/cluster.md's serving
manifest played with ``podman kube play``, against the default image the integration fixtures
build (tiny-llama on vLLM's CPU build).

What each substitutes is said where it happens, and nothing else is changed: the README's
``$IMAGE`` becomes the built image and the host port a free one; in deploy/examples/serve.yaml
the ``image:`` fields become the built image, the ``nvidia.com/gpu`` limit is dropped (no GPU
here), and the pod's restartPolicy is OnFailure, because podman 4.3 applies Always to init
containers too and restarts the seeding one for ever."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from kernelbake.pipeline import Built
from tests.conftest import REPO
from tests.integration.conftest import QuickStart
from tests.support import runbook
from tests.support.podman import pull, require_podman
from tests.test_docs import README, blocks

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]

HEALTH_TIMEOUT_S = 900
SERVE = REPO / "deploy" / "examples" / "serve.yaml"
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
    # same words; a number of files is that number (times and digests vary).
    (sample,) = blocks(README.read_text(), "serve-output")
    printed = readme_served.log.splitlines()
    for kind in KINDS:
        shown = [ln for ln in sample.splitlines() if ln.startswith(kind)]
        said = [ln for ln in printed if ln.startswith(kind)]
        assert len(shown) == len(said), (kind, shown, said)
        for want, got in zip(shown, said, strict=True):
            assert runbook.shown_line(want).fullmatch(got), (want, got)
            assert FILES.findall(want) == FILES.findall(got), (want, got)
    assert any("baked caches valid (exact match)" in ln for ln in printed), printed


def cluster_page_containers_conf() -> str:
    """The ``containers.conf`` docs/cluster.md's podman recipe writes (its ``printf`` line)."""
    (block,) = [
        b for b in runbook.parse(CLUSTER.read_text(), "docs/cluster.md") if "default_ulimits" in b.body
    ]
    (line,) = [ln for ln in block.body.splitlines() if ln.startswith("printf ") and "containers.conf" in ln]
    return shlex.split(line)[1].replace("\\n", "\n")


@contextlib.contextmanager
def played(manifest: Path, workdir: Path) -> Iterator[dict[str, str]]:
    """``podman kube play`` of ``manifest``; yields podman's environment, then ``kube down``."""
    conf = workdir / "containers.conf"
    # Podman 4.3 as root raises RLIMIT_NOFILE/NPROC beyond what these machines allow runc
    # (tests/support/podman.py); the limits docs/cluster.md's podman recipe sets, for kube play.
    conf.write_text(cluster_page_containers_conf())
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    play = subprocess.run(
        ["podman", "kube", "play", "--tls-verify=false", str(manifest)],
        capture_output=True,
        text=True,
        env=env,
    )
    try:
        assert play.returncode == 0, play.stdout + play.stderr
        yield env
    finally:
        subprocess.run(["podman", "kube", "down", str(manifest)], capture_output=True, env=env)
        for volume in ("kernel-cache", "tmp", "shm"):
            subprocess.run(["podman", "volume", "rm", "-f", volume], capture_output=True, env=env)


def test_the_serve_manifest_plays_with_podman_read_only_warm_and_serving(
    vllm_image: Built, tmp_path: Path
) -> None:
    require_podman()
    assert vllm_image.pushed is not None
    image = vllm_image.pushed
    pull(image)
    obj = yaml.safe_load(SERVE.read_text())
    spec = obj["spec"]["template"]["spec"]
    for c in [*spec["initContainers"], *spec["containers"]]:
        c["image"] = image
    del spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    spec["restartPolicy"] = "OnFailure"
    manifest = tmp_path / "serve.yaml"
    manifest.write_text(yaml.safe_dump(obj))
    pod = f"{obj['metadata']['name']}-pod-0"
    ctr = f"{pod}-{spec['containers'][0]['name']}"
    with played(manifest, tmp_path) as env:

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
