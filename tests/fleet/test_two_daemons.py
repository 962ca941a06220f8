"""For real: two stand-in GPU families, each its own Docker daemon with its own CDI device,
build one model at once; the variants and their index go to the local registry, are signed,
and resolve to the variant of each family."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelbake.contract.variants import variants_from_index
from kernelbake.oci import RegistryClient, parse_reference
from kernelbake.pipeline import BuildOptions, Built, Driver
from kernelbake.plan import plan
from kernelbake.publish.index import publish_index
from kernelbake.render import BuildMode
from kernelbake.settings import Settings
from kernelbake.spec import load_spec
from tests.admission import live
from tests.support.docker import CPU_BASE
from tests.support.fleet import SPEC, two_daemons

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]


@pytest.fixture(scope="module")
def fleet_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two more Docker daemons, one per stand-in GPU family, each loaded with the torch CPU base."""
    with two_daemons(tmp_path_factory.mktemp("fleet")) as env:
        yield env


@pytest.fixture(scope="module")
def built(fleet_env: dict[str, str], registry: str, tmp_path_factory: pytest.TempPathFactory) -> list[Built]:
    """The fleet spec built two-phase on both daemons at once, each compiling on its own core."""
    targets = plan(load_spec(SPEC), [], registry=f"{registry}/fleet")
    out = tmp_path_factory.mktemp("fleet-build")
    return Driver(Settings.from_env(fleet_env)).build(
        targets, BuildOptions(out=out, push=True, mode=BuildMode.TWO_PHASE)
    )


def test_each_family_built_on_its_own_daemon_with_its_own_device(
    built: list[Built], fleet_env: dict[str, str]
) -> None:
    assert [b.target.gpu.name for b in built] == ["test-a", "test-b"]
    for b in built:
        assert b.pushed is not None
        # The compile stage measured the stand-in device (else it refuses: exit 6) on the
        # family's own daemon, whose CDI device named the builder.
        doc = json.loads(live.kernelbake("inspect", b.pushed, "--json").stdout)
        assert doc["cache_manifest"]["builder"]["device"] == b.target.gpu.device_name
        assert doc["cache_manifest"]["builder"]["host"] == f"test-fleet:{b.target.gpu.family[-1]}"
        assert doc["cache_manifest"]["files"] > 0


def test_the_index_signs_verifies_and_resolves_per_family(built: list[Built], tmp_path: Path) -> None:
    pushed = [b.pushed for b in built if b.pushed]
    index = publish_index(pushed)
    top = RegistryClient(timeout=30).get_manifest(parse_reference(index))
    devices = [v.key.device for v in variants_from_index(top.doc, source=index)]
    assert devices == ["kernelbake test device A", "kernelbake test device B"]
    key, pub = live.generate_key(tmp_path / "keys", "fleet")
    done = live.kernelbake("sign", "--key", str(key), index)
    assert done.stderr.count("signed ") == 2 and index.split("@")[1] in done.stdout
    for b in built:
        assert b.pushed is not None
        live.kernelbake("verify", b.pushed, "--key", str(pub))
    for b in built:
        doc = json.loads(
            live.kernelbake("resolve", index, "--gpu-product", b.target.gpu.gfd_product[0], "--json").stdout
        )
        assert doc["run"] == b.pushed
        assert [v["tier"] for v in doc["variants"]] == ["same device", "same arch, other device"]


def test_each_stand_in_daemon_runs_its_containers_on_its_own_core(fleet_env: dict[str, str]) -> None:
    """bench/fleet_build.py's premise: two builders at once share no core, as separate hosts."""
    root = Path(fleet_env["DOCKER_CONFIG"]).parent
    assert (os.cpu_count() or 1) >= 2, "the stand-in daemons need a core each"
    seen = {}
    for family in ("a", "b"):
        cpus = (root / family / "cpuset").read_text().strip()
        docker = ["docker", "--context", f"kernelbake-test-{family}"]
        probe = ["--entrypoint", "grep", CPU_BASE, "Cpus_allowed_list", "/proc/self/status"]
        ran = subprocess.run(
            [*docker, "run", "--rm", "--network", "none", *probe],
            env=fleet_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert ran.returncode == 0, ran.stderr
        seen[family] = ran.stdout.split()[-1]
        assert seen[family] == cpus
    assert seen == {"a": "0", "b": "1"}
