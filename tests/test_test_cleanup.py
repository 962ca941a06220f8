"""What the tests tag in the shared Docker daemon goes with the registry it points at: a
name under a stopped test registry's address would point at nothing (issue 33 item 6)."""

from __future__ import annotations

import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from tests.support.docker import docker, local_names
from tests.support.registry import STARTED, running_registry


@pytest.mark.docker
@pytest.mark.registry
def test_a_test_registry_s_teardown_removes_the_local_names_under_its_address(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tar"
    tarfile.open(empty, "w").close()
    repo = f"kernelbake-tests/cleanup-{uuid.uuid4().hex[:8]}"
    with running_registry(tmp_path / "registry") as addr:
        names = [f"{addr}/{repo}:a", f"{addr}/{repo}:b"]
        subprocess.run(
            ["docker", "import", str(empty), names[0]], check=True, capture_output=True, timeout=60
        )
        docker("tag", names[0], names[1])
        assert local_names(f"{addr}/") == names
    assert addr in STARTED
    assert local_names(f"{addr}/") == []
