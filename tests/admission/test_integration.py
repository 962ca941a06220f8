"""The webhook as a process, over real HTTPS (CA from deploy/make-cert.sh), verifying images
in the real local docker-registry that ``kernelbake sign`` signed, with AdmissionReview
documents as the API server sends them."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelbake.admission.rules.gpu import KEY_FALLBACK
from tests.admission import documents, live
from tests.admission.documents import H100
from tests.signing.images import PushedImage
from tests.support.registry import free_port

pytestmark = pytest.mark.registry

REPOSITORY = "kernelbake/qwen3-0.6b"


@dataclasses.dataclass
class World:
    registry: str
    certs: Path
    policy: Path
    served: live.Served
    h100: PushedImage
    a100: PushedImage
    unsigned: PushedImage
    mallory: PushedImage
    dead: str
    slow: str

    def post(self, path: str, doc: Any) -> dict[str, Any]:
        answer = live.post_review(self.served.port, self.certs, path, doc)
        assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
        response: dict[str, Any] = answer["response"]
        return response


def hold_connections() -> tuple[socket.socket, threading.Event]:
    """A 'registry' that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue
        for c in held:
            c.close()

    threading.Thread(target=accept, daemon=True).start()
    return sock, stop


@pytest.fixture(scope="module")
def world(registry: str, certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("admission-live")
    trusted_key, trusted_pub = live.generate_key(tmp / "keys", "trusted")
    other_key, _ = live.generate_key(tmp / "keys", "other")
    h100 = live.push_target(registry, REPOSITORY, "h100", "h100", tmp / "h100")
    a100 = live.push_target(registry, REPOSITORY, "a100", "a100-80gb", tmp / "a100")
    unsigned = live.push_target(registry, REPOSITORY, "unsigned", "h100", tmp / "unsigned")
    mallory = live.push_target(registry, REPOSITORY, "mallory", "h100", tmp / "mallory")
    live.sign(h100, trusted_key)
    live.sign(a100, trusted_key)
    live.sign(mallory, other_key)
    dead = f"127.0.0.1:{free_port()}"
    slow_sock, stop = hold_connections()
    slow = f"127.0.0.1:{slow_sock.getsockname()[1]}"
    patterns = [f"{host}/kernelbake/**" for host in (registry, dead, slow)]
    policy = live.write_policy(tmp / "policy.yaml", patterns, trusted_pub, deadline_seconds=2)
    try:
        with live.serving(policy, certs) as served:
            yield World(registry, certs, policy, served, h100, a100, unsigned, mallory, dead, slow)
            assert served.process.poll() is None, served.log
    finally:
        stop.set()
        slow_sock.close()


def test_signed_pod_on_its_gpu_is_admitted_and_pinned_to_the_signed_digest(world: World) -> None:
    doc = documents.load("pod-create", world.h100.tagged)
    response = world.post("/mutate", doc)
    assert response["allowed"] is True, response
    pod = documents.apply_patch(doc, response)
    assert pod["spec"]["containers"][0]["image"] == world.h100.pinned
    # What the pod now runs is what the validating webhook sees after mutation.
    doc["request"]["object"] = pod
    assert world.post("/validate", doc) == {"uid": doc["request"]["uid"], "allowed": True}


def test_deployment_create_and_update(world: World) -> None:
    doc = documents.load("deployment-create", world.h100.tagged)
    response = world.post("/mutate", doc)
    assert response["allowed"] is True, response
    spec = documents.apply_patch(doc, response)["spec"]["template"]["spec"]
    pinned = world.h100.pinned
    assert [c["image"] for c in spec["initContainers"] + spec["containers"]] == [
        pinned,
        pinned,
        "docker.io/prom/statsd-exporter:v0.28.0",
    ]
    update = documents.as_update(
        documents.load("deployment-create", world.a100.tagged), old_image=world.h100.tagged
    )
    response = world.post("/mutate", update)
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert response["status"]["code"] == 403
    assert (
        f"was baked for NVIDIA A100-SXM4-80GB (sm_80) but its required node affinity term 1 admits {H100}"
        in message
    )
    assert "arch: baked 'sm_80', found 'sm_90a'" in message
    assert "add nodeSelector nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB" in message


def test_pod_update_to_a_signed_image_on_its_gpu(world: World) -> None:
    doc = documents.load("pod-create", world.a100.tagged)
    documents.schedule(doc, node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    update = documents.as_update(doc, old_image=world.h100.tagged)
    response = world.post("/mutate", update)
    assert response["allowed"] is True, response
    assert documents.apply_patch(update, response)["spec"]["containers"][0]["image"].endswith(
        world.a100.digest
    )


def test_unsigned_and_wrong_signer_are_denied(world: World) -> None:
    response = world.post("/mutate", documents.load("pod-create", world.unsigned.tagged))
    assert response["allowed"] is False
    assert f"image {world.unsigned.tagged} was rejected" in response["status"]["message"]
    assert "no signature found" in response["status"]["message"]
    response = world.post("/validate", documents.load("pod-create", world.mallory.tagged))
    assert response["allowed"] is False
    assert "no trusted signature" in response["status"]["message"], response


def test_a_pod_without_a_gpu_constraint_is_told_what_to_add(world: World) -> None:
    doc = documents.schedule(documents.load("pod-create", world.h100.tagged))
    response = world.post("/mutate", doc)
    assert response["allowed"] is False
    assert response["status"]["message"].endswith(
        f"does not pin a GPU; add nodeSelector nvidia.com/gpu.product: {H100} ({KEY_FALLBACK})"
    )


def test_digest_pinned_references(world: World) -> None:
    both = f"{world.registry}/{REPOSITORY}:a100@{world.h100.digest}"
    doc = documents.load("pod-create", both)
    response = world.post("/mutate", doc)
    assert response["allowed"] is True, response
    assert documents.apply_patch(doc, response)["spec"]["containers"][0]["image"] == world.h100.pinned
    assert any("the digest wins" in w for w in response["warnings"])
    response = world.post(
        "/mutate", documents.load("pod-create", f"{world.registry}/{REPOSITORY}@sha256:{'0' * 64}")
    )
    assert response["allowed"] is False and "image not found" in response["status"]["message"]


def test_missing_tag_and_missing_image(world: World) -> None:
    response = world.post("/mutate", documents.load("pod-create", f"{world.registry}/{REPOSITORY}"))
    assert response["allowed"] is False and "has no tag or digest" in response["status"]["message"]
    response = world.post("/mutate", documents.load("pod-create", f"{world.registry}/{REPOSITORY}:nope"))
    assert response["allowed"] is False and "image not found" in response["status"]["message"]


@pytest.mark.parametrize("which", ["dead", "slow"])
def test_registry_down_or_silent_is_a_503_denial(world: World, which: str) -> None:
    image = f"{getattr(world, which)}/{REPOSITORY}:h100"
    response = world.post("/mutate", documents.load("pod-create", image))
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert "could not be verified" in response["status"]["message"]


def test_other_spellings_of_the_registry_host_cannot_bypass_the_policy(world: World) -> None:
    """The registry is governed as ``127.0.0.1:<port>``; the runtime reaches the same server
    through ``127.1:<port>`` or ``0x7f.0.0.1:<port>``: those are verified like the canonical
    name, and ``localhost:<port>``, ``0.0.0.0:<port>`` … (maybe the same server) are denied
    naming the spelling."""
    port = world.registry.rpartition(":")[2]
    unsigned = world.unsigned.tagged.replace(world.registry, f"0x7f.0.0.1:{port}")
    response = world.post("/mutate", documents.load("pod-create", unsigned))
    assert response["allowed"] is False
    assert f"image {unsigned} was rejected" in response["status"]["message"]
    assert "no signature found" in response["status"]["message"]

    signed = world.h100.tagged.replace(world.registry, f"127.1:0{port}")
    doc = documents.load("pod-create", signed)
    response = world.post("/mutate", doc)
    assert response["allowed"] is True, response
    assert documents.apply_patch(doc, response)["spec"]["containers"][0]["image"] == (
        f"127.1:0{port}/{REPOSITORY}@{world.h100.digest}"
    )

    # The unspecified addresses reach the local host as loopback does (issue 20, item 10).
    for host in ("localhost", "0.0.0.0", "0", "[::]"):
        alias = world.unsigned.tagged.replace(world.registry, f"{host}:{port}")
        response = world.post("/mutate", documents.load("pod-create", alias))
        assert response["allowed"] is False, (alias, response)
        assert f"write it as {world.registry}/{REPOSITORY}" in response["status"]["message"]


def test_image_volumes_are_verified_and_pinned_like_containers(world: World) -> None:
    """The attack of issue 20: an unsigned image of the governed repository mounted over the
    cache root of a signed container was admitted. Denied now, on both endpoints; a signed
    volume is pinned to its signed digest."""
    attack = documents.add_image_volume(
        documents.load("pod-create", world.h100.tagged), world.unsigned.tagged
    )
    for path in ("/mutate", "/validate"):
        response = world.post(path, attack)
        assert response["allowed"] is False, response
        message = response["status"]["message"]
        assert f'image volume "kernel-cache": image {world.unsigned.tagged} was rejected' in message
        assert "no signature found" in message
    doc = documents.add_image_volume(documents.load("pod-create", world.h100.tagged), world.a100.tagged)
    response = world.post("/mutate", doc)
    assert response["allowed"] is True, response
    pod = documents.apply_patch(doc, response)
    assert pod["spec"]["volumes"][1]["image"]["reference"] == world.a100.pinned
    doc["request"]["object"] = pod
    assert world.post("/validate", doc)["allowed"] is True


def test_ungoverned_images_pass_untouched(world: World) -> None:
    doc = documents.schedule(documents.load("pod-create", "docker.io/library/busybox:1.36"))
    assert world.post("/mutate", doc) == {"uid": doc["request"]["uid"], "allowed": True}


def test_cli_review_of_one_file(world: World, tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(documents.load("pod-create", world.h100.tagged)))
    done = live.kernelbake("admission", "review", "--policy", str(world.policy), str(request), check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["response"]["allowed"] is True
    unsigned = json.dumps(documents.load("pod-create", world.unsigned.tagged))
    done = live.kernelbake(
        "admission", "review", "--policy", str(world.policy), "-", check=False, stdin=unsigned
    )
    assert done.returncode == 1
    assert json.loads(done.stdout)["response"]["allowed"] is False
    assert done.stderr.startswith('denied: kernelbake admission: container "vllm"')
    request.write_text("{not json")
    done = live.kernelbake("admission", "review", "--policy", str(world.policy), str(request), check=False)
    assert done.returncode == 2 and "not JSON" in done.stderr and done.stderr.count("\n") == 1


def test_workers_share_the_port_stop_together_and_die_together(world: World, tmp_path: Path) -> None:
    policy = tmp_path / "workers.yaml"
    policy.write_text(world.policy.read_text())
    with live.serving(policy, world.certs, workers=2) as served:
        probe = dataclasses.replace(world, served=served)
        # Enough connections that the kernel hands some to each worker (each its own cache).
        for i in range(16):
            doc = documents.load("pod-create", world.h100.tagged, uid=f"w-{i}")
            response = probe.post("/mutate", doc)
            assert response["allowed"] is True, response
    assert served.process.returncode == 0, served.log
    with live.serving(policy, world.certs, workers=2) as served:
        pid = served.process.pid
        # The "listening" line comes before the fork: on a loaded host the test can read the
        # children before the parent has made them.
        children = Path(f"/proc/{pid}/task/{pid}/children")
        until = time.monotonic() + 30
        while len(workers := [int(p) for p in children.read_text().split()]) < 2 and time.monotonic() < until:
            time.sleep(0.05)
        assert len(workers) == 2
        # A worker that dies on its own takes the pod down (Kubernetes restarts it), not half of it.
        os.kill(workers[0], signal.SIGKILL)
        assert served.process.wait(30) == 1
        assert "exited (-9) on its own" in served.log
