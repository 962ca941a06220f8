"""An image built by ``docker build`` (FROM scratch, labels from ``plan()``, the cache manifest
COPYed last) and pushed by ``docker push``: signed and verified like any kernelbake image."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelbake.contract.layout import CacheKind
from kernelbake.oci import RegistryClient
from kernelbake.runtime.bundle import write_manifest
from kernelbake.signing.errors import LabelMismatch
from kernelbake.signing.sign import sign_image
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import KeyPair, need
from tests.signing.images import tiny_llama_target

pytestmark = [pytest.mark.docker, pytest.mark.registry]

DOCKERFILE = """\
FROM scratch
COPY cache/ /opt/kernelbake/cache/
COPY manifest.json /opt/kernelbake/cache/manifest.json
"""


def docker(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"docker {' '.join(args)} failed:\n{result.stderr}"
    return result


@dataclasses.dataclass
class Built:
    tag: str
    labels: dict[str, str]
    image_ids: list[str]  # everything this test made in the shared daemon, removed afterwards


@pytest.fixture
def built(registry: str, tmp_path: Path) -> Iterator[Built]:
    need(shutil.which("docker"), "docker")
    target = tiny_llama_target()
    context = tmp_path / "ctx"
    cache = tmp_path / "cache-root"
    (cache / "inductor").mkdir(parents=True)
    (cache / "inductor/graph.py").write_text("# compiled\n")
    write_manifest(
        cache, target.key, [CacheKind.INDUCTOR], report={"builder": {"device": "cpu", "driver": "none"}}
    )
    (context / "cache").mkdir(parents=True)
    shutil.copytree(cache / "inductor", context / "cache/inductor")
    shutil.copy(cache / "manifest.json", context / "manifest.json")
    (context / "Dockerfile").write_text(DOCKERFILE)
    labels = dict(target.labels)
    tag = f"{registry}/kb/docker-{uuid.uuid4().hex[:8]}:v1"
    label_args = [a for k, v in labels.items() for a in ("--label", f"{k}={v}")]
    result = Built(tag, labels, [docker("build", "-q", "-t", tag, *label_args, str(context)).stdout.strip()])
    try:
        docker("push", "-q", tag)
        yield result
    finally:
        subprocess.run(["docker", "rmi", "-f", tag, *result.image_ids], capture_output=True, timeout=60)


def test_docker_built_image_signs_and_verifies(built: Built, client: RegistryClient, keys: KeyPair) -> None:
    tag, labels = built.tag, built.labels
    signed = sign_image(tag, keys.signer, client=client, legacy=True)
    assert signed.predicate is not None
    assert signed.predicate.builder == {"device": "cpu", "driver": "none"}
    verified = verify_image(tag, keys.policy(), client=client)
    assert verified.digest == signed.digest
    assert verified.key == tiny_llama_target().key
    assert verified.attestation["baseImage"]["name"] == labels["org.opencontainers.image.base.name"]


def test_docker_relabel_after_signing_is_caught(
    built: Built, client: RegistryClient, keys: KeyPair, tmp_path: Path
) -> None:
    tag = built.tag
    signed = sign_image(tag, keys.signer, client=client)
    assert signed.predicate is not None
    # Rebuild on top of the signed image with one label changed, as `docker build --label` would.
    (tmp_path / "relabel").mkdir()
    (tmp_path / "relabel/Dockerfile").write_text(f"FROM {tag}\n")
    docker(
        "build",
        "-q",
        "-t",
        tag,
        "--label",
        "dev.kernelbake.device=NVIDIA H100 PCIe",
        str(tmp_path / "relabel"),
    )
    docker("push", "-q", tag)
    # A trusted pipeline that re-signs whatever is pushed and copies the attestation forward:
    sign_image(tag, keys.signer, client=client, attest=False)
    from kernelbake.signing.predicate import PREDICATE_TYPE
    from tests.support.attacks import attach_statement

    attach_statement(tag, keys.signer, PREDICATE_TYPE, signed.predicate.to_json(), client=client)
    with pytest.raises(LabelMismatch, match="device"):
        verify_image(tag, keys.policy(), client=client)
