from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelbake.bake import compile_env_ref
from kernelbake.build import BuildOptions, Built, Driver
from kernelbake.plan import plan
from kernelbake.render import BuildMode
from kernelbake.settings import Settings
from kernelbake.spec import load_spec
from tests.conftest import REPO
from tests.support.docker import CPU_BASE, VLLM_CPU_BASE, require_cpu_base

TEST_CDI = REPO / "buildkit" / "cdi" / "kernelbake-test.yaml"
INSTALLED_CDI = Path("/etc/cdi/kernelbake-test.yaml")
TEST_DEVICE = "kernelbake.dev/test=builder"


def build_tiny(out: Path, registry: str, spec: str = "tiny-llama-torch", **options: object) -> Built:
    require_cpu_base(VLLM_CPU_BASE if spec == "tiny-llama" else CPU_BASE)
    targets = plan(load_spec(REPO / "images" / f"{spec}.yaml"), ["cpu"], registry=registry)
    (built,) = Driver(Settings.from_env()).build(targets, BuildOptions(out=out, push=True, **options))  # type: ignore[arg-type]
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
