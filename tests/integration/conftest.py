from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelbake.bake.bakefile import compile_env_ref
from kernelbake.pipeline import BuildOptions, Built, Driver
from kernelbake.plan import plan
from kernelbake.render import BuildMode
from kernelbake.settings import Settings
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.integration import _serving
from tests.support import criu
from tests.support.docker import CPU_BASE, VLLM_CPU_BASE, docker, require_cpu_base
from tests.support.registry import free_port
from tests.support.runbook import commands
from tests.test_docs import README, blocks

TEST_CDI = REPO / "buildkit" / "cdi" / "kernelbake-test.yaml"
INSTALLED_CDI = Path("/etc/cdi/kernelbake-test.yaml")
TEST_DEVICE = "kernelbake.dev/test=builder"


def build_tiny(out: Path, registry: str, spec: str = "tiny-llama-torch", **options: object) -> Built:
    require_cpu_base(VLLM_CPU_BASE if spec == "tiny-llama" else CPU_BASE)
    loaded = load_spec(REPO / "images" / f"{spec}.yaml")
    targets = plan(loaded, ["cpu"], registry=registry)
    environ = dict(os.environ)
    if loaded.snapshot:
        environ["KERNELBAKE_CRIU_PREFIX"] = str(criu.install(out / "criu"))
    driver = Driver(Settings.from_env(environ))
    (built,) = driver.build(targets, BuildOptions(out=out, push=True, **options))  # type: ignore[arg-type]
    return built


@pytest.fixture(scope="session")
def single_image(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """tiny-llama built in one build (compile stage inside BuildKit) and pushed."""
    return build_tiny(tmp_path_factory.mktemp("single"), f"{registry}/single")


@pytest.fixture(scope="session")
def vllm_image(registry: str, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """tiny-llama on vLLM's CPU build (the `make image` default), built and pushed."""
    return build_tiny(tmp_path_factory.mktemp("vllm"), f"{registry}/vllm", spec="tiny-llama")


@pytest.fixture(scope="session")
def test_cdi_device() -> str:
    """The hardware-free CDI device that make deps installs (installed here when missing)."""
    if not INSTALLED_CDI.is_file() or INSTALLED_CDI.read_bytes() != TEST_CDI.read_bytes():
        INSTALLED_CDI.parent.mkdir(parents=True, exist_ok=True)
        INSTALLED_CDI.write_bytes(TEST_CDI.read_bytes())
    return TEST_DEVICE


@pytest.fixture(scope="session")
def two_phase_image(
    registry: str, tmp_path_factory: pytest.TempPathFactory, test_cdi_device: str
) -> Iterator[Built]:
    """tiny-llama compiled by `docker run --device <test CDI device>`, then built and pushed.
    The compile-env image is a local tag outside the registry: removed here (the registry's
    teardown removes the names under its address)."""
    try:
        yield build_tiny(
            tmp_path_factory.mktemp("two-phase"),
            f"{registry}/two-phase",
            mode=BuildMode.TWO_PHASE,
            device=test_cdi_device,
        )
    finally:
        (target,) = plan(
            load_spec(REPO / "images" / "tiny-llama-torch.yaml"), ["cpu"], registry=f"{registry}/two-phase"
        )
        subprocess.run(["docker", "rmi", compile_env_ref(target)], capture_output=True, timeout=60)


def quick_start() -> list[list[str]]:
    """The commands of the README's quick start, in order."""
    return [c for b in blocks(README.read_text(), "quick-start") for c in commands(b)]


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuickStart:
    image: str
    argv: list[str]  # the README's docker run, as run
    answer: dict[str, Any]  # what the README's curl printed
    log: str  # the container's whole log, once serve printed what the start compiled


@pytest.fixture(scope="session")
def readme_served(vllm_image: Built) -> QuickStart:
    """The README's quick start on the default image, pulled from the registry (the local copy
    removed first): its ``docker run``, with the built image for ``$IMAGE`` and a free host
    port, until /health answers, then its ``curl``. One start, read by the README's test
    (test_docs_run) and the pulled image's (test_vllm_cpu_image)."""
    assert vllm_image.pushed is not None
    image = vllm_image.pushed
    docker("image", "rm", image)
    docker("pull", image)
    steps = quick_start()
    (run,) = [c for c in steps if c[:2] == ["docker", "run"] and "-p" in c]
    (curl,) = [c for c in steps if c[0] == "curl"]
    port = free_port()
    name = f"kb-readme-{port}"
    argv = [image if w == "$IMAGE" else w for w in run]
    argv[argv.index("-p") + 1] = f"127.0.0.1:{port}:8000"
    # Detached (the README runs it in the foreground of its own shell), under a name to remove.
    argv[2:2] = ["-d", "--name", name]
    cid = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()
    try:
        _serving.wait_healthy(docker, port, cid, 900)
        sent = [w.replace("localhost:8000", f"127.0.0.1:{port}") for w in curl]
        done = subprocess.run(sent, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        _serving.wait_for_serve_line(docker, cid, "start-up compiled")
        return QuickStart(
            image=image, argv=argv, answer=json.loads(done.stdout), log=_serving.logs(docker, cid)
        )
    finally:
        docker("rm", "-f", cid, check=False)
