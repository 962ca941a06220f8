"""deploy/examples/serve-snapshot.yaml run as a kubelet would run it (podman, tests/support/podman.py):
the default image, which carries its own CRIU (spec ``snapshot: true``), is snapshotted in a Docker
container and the snapshot pushed, signed, to a registry; the recipe's pod, with the image and the
snapshot volume substituted, the GPU left out and the two pins admission sets after verifying
(tests/admission/test_snapshots.py reviews the recipe through the webhook), restores from the image
volume as podman mounts it, with the recipe's capabilities and seccomp profile and nothing mounted
for CRIU, and serves a completion."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernelbake.contract.snapshot import (
    IMAGE_DIGEST_ENV,
    SNAPSHOT_CAPABILITIES,
    SNAPSHOT_DIGEST_ENV,
    SNAPSHOT_MANIFEST,
    SnapshotManifest,
)
from kernelbake.oci import RegistryClient
from kernelbake.pipeline import Built
from kernelbake.settings import Settings
from kernelbake.signing.keys import generate_key_pair, load_private_key
from kernelbake.signing.policy import VerifyPolicy
from kernelbake.signing.signer import KeySigner
from kernelbake.signing.snapshot import push_snapshot, verify_snapshot
from tests.conftest import REPO
from tests.integration import _serving
from tests.integration._serving import complete, wait_healthy
from tests.support.podman import ULIMITS, PodRun, podman, pull, pulled
from tests.support.registry import free_port, running_registry

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]

RECIPE = REPO / "deploy" / "examples" / "serve-snapshot.yaml"


def _take(image: str, out: Path) -> Path:
    """``make snapshot``'s take, in Docker, with the image's own CRIU, and the resource limits
    the pod will have (podman's here: ULIMITS): CRIU gives each process its limits back and
    cannot raise a hard one, so the gate refuses a restore under lower limits."""
    argv = [
        "docker", "run", "--rm", "--cap-drop=ALL", *(f"--cap-add={c}" for c in sorted(SNAPSHOT_CAPABILITIES)), "--security-opt", "seccomp=unconfined", "--shm-size", "1g", *ULIMITS,
        "-v", f"{out}:/work", "--entrypoint", "python3", image,
        "-m", "kernelbake", "snapshot", "take", "--out", "/work/snap", "--image-digest", image.split("@")[1],
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out / "snap"


def _pod(image: str, snapshot: str, pins: dict[str, str]) -> dict[str, Any]:
    """The recipe's pod spec: its image and snapshot volume these, no GPU (the CPU image), and
    the variables the webhook sets."""
    spec: dict[str, Any] = yaml.safe_load(RECIPE.read_text())["spec"]["template"]["spec"]
    container = spec["containers"][0]
    container["image"] = image
    del container["resources"]["limits"]["nvidia.com/gpu"]
    spec.pop("nodeSelector")
    next(v for v in spec["volumes"] if v["name"] == "snapshot")["image"]["reference"] = snapshot
    container["env"] += [{"name": k, "value": v} for k, v in pins.items()]
    return spec


def test_the_snapshot_recipe_restores_in_a_pod_from_the_pushed_artifact(
    vllm_image: Built, tmp_path: Path
) -> None:
    image = pulled(vllm_image)
    # The recipe's set after drop: [ALL], whatever podman's defaults are (smaller than Docker's):
    # the snapshot is taken with exactly the set it is restored with.
    taken = _take(image, tmp_path / "take")
    recorded = SnapshotManifest.from_json((taken / SNAPSHOT_MANIFEST).read_bytes(), source="take")
    assert recorded.rlimits is not None and recorded.rlimits["NOFILE"] == 16384
    # What the tree held, read from each process at take: every capability its container gave.
    assert recorded.capabilities is not None and set(recorded.capabilities) == SNAPSHOT_CAPABILITIES
    # A registry of this test's own, removed with it: the snapshot is 2.2 GB.
    with running_registry(tmp_path / "registry") as addr:
        client = RegistryClient(Settings(docker_config=tmp_path / "docker"), timeout=30)
        private, public = generate_key_pair(tmp_path / "keys", name="kb")
        pushed = push_snapshot(
            taken,
            base=image,
            signer=KeySigner(load_private_key(private)),
            client=client,
            to=f"{addr}/kb/tiny-llama:snapshot",
        )
        shutil.rmtree(taken)
        policy = VerifyPolicy.from_mapping({"keys": [str(public)]}, source="test")
        verified = verify_snapshot(pushed.reference, base=image, policy=policy, client=client)
        pins = {SNAPSHOT_DIGEST_ENV: verified.manifest_digest, IMAGE_DIGEST_ENV: image.split("@")[1]}
        # The webhook pins the volume to the digest it verified.
        run = PodRun(_pod(image, pushed.reference, pins), tmp_path / "pod", {})
        for ref in [image, *run.images]:
            pull(ref)
        port = free_port()
        argv = run.main_argv(["-p", f"127.0.0.1:{port}:8000"])
        assert not any("/opt/kernelbake/criu" in a for a in argv), argv
        cid = podman(*argv[1:]).stdout.strip()
        try:
            wait_healthy(podman, port, cid, 300)
            out = complete(port)
            logs = _serving.logs(podman, cid)
        finally:
            podman("rm", "-f", cid, check=False)
            podman("rmi", "-f", *run.images, check=False)
    # Not kept for the rest of the run: CI's disk had 7.6 GB free near its end.
    shutil.rmtree(tmp_path / "registry", ignore_errors=True)
    said = [line for line in logs.splitlines() if line.startswith("kernelbake serve:")]
    assert any(line.startswith("kernelbake serve: restored snapshot") for line in said), "\n".join(said)
    assert "weights inside" in "\n".join(said) and out["usage"]["completion_tokens"] > 0
