"""The two-phase build for real: `docker run --device <CDI device>` compiles into a directory
that the final build takes as the named context `caches`."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbake.errors import BuildFailed
from kernelbake.pipeline import Built
from kernelbake.remote import inspect_remote
from kernelbake.render import BuildMode
from tests.integration.conftest import build_tiny
from tests.support.docker import docker, ready_line

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]


def test_cdi_device_reached_the_compile_step(two_phase_image: Built) -> None:
    assert two_phase_image.pushed is not None
    image = inspect_remote(two_phase_image.pushed)
    assert image.cache_manifest is not None
    builder = dict(image.cache_manifest.compile_report)["builder"]
    # Set only by the CDI spec's containerEdits: proof that docker run injected the device.
    assert builder["host"] == "cdi:kernelbake.dev/test=builder"


def test_two_phase_image_starts_warm(two_phase_image: Built) -> None:
    assert two_phase_image.pushed is not None
    res = docker("run", "--rm", two_phase_image.pushed, "--warmup-only")
    counters = ready_line(res.stdout)["counters"]
    assert counters["fxgraph_cache_hit"] >= 1 and counters["fxgraph_cache_miss"] == 0


def test_unknown_cdi_device_fails_the_compile_stage(
    registry: str, tmp_path: Path, test_cdi_device: str
) -> None:
    with pytest.raises(BuildFailed) as info:
        build_tiny(
            tmp_path,
            f"{registry}/unknown-device",
            mode=BuildMode.TWO_PHASE,
            device="kernelbake.dev/test=nope",
        )
    assert "stage 'compile'" in str(info.value)
    log = tmp_path / "tiny-llama-torch-cpu" / "logs" / "compile.log"
    assert "unresolvable CDI devices kernelbake.dev/test=nope" in log.read_text()
    assert (
        docker(
            "manifest", "inspect", "--insecure", f"{registry}/unknown-device/tiny-llama:x", check=False
        ).returncode
        != 0
    )
