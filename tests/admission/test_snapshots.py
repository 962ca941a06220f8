"""Restore capabilities are admitted only for a verified snapshot of the container's own image,
whose key the pod's serve arguments and variables match as far as admission can see them, with
nothing beyond the measured set; the pins serve trusts are set by admission alone.

The pure decision first (``rules.snapshot_restore.decide``), then the webhook (``Admitter`` with the gateway
and a verifier, as the server runs it), and last the real verifier against a registry."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from kernelbake.admission.admit import Endpoint
from kernelbake.admission.gateway import ImageRejected
from kernelbake.admission.pod import walk
from kernelbake.admission.references import parse_reference
from kernelbake.admission.rules import snapshot_restore
from kernelbake.admission.rules.shape import Verdict
from kernelbake.admission.subject import Image as Verified
from kernelbake.admission.subject import Snapshot
from kernelbake.admission.verifying import VerifiedSnapshotVolume
from kernelbake.admission.workloads import MalformedObject
from kernelbake.contract.key import CacheKey
from kernelbake.contract.snapshot import (
    IMAGE_DIGEST_ENV,
    SNAPSHOT_DIGEST_ENV,
    SNAPSHOT_MANIFEST,
    SNAPSHOT_ROOT,
    SnapshotKey,
    SnapshotManifest,
    env_digest,
)
from kernelbake.plan import plan as plan_targets
from kernelbake.spec import load_spec
from tests.admission import documents
from tests.admission.fakes import FakeVerified, digest_of, make_admitter, make_policy
from tests.conftest import REPO
from tests.contract.test_snapshot import cpu_key

IMAGE = "reg.example/kb/tiny@sha256:" + "1" * 64
DIGEST = "sha256:" + "1" * 64
OTHER = "sha256:" + "2" * 64
SNAP_JSON = "sha256:" + "3" * 64
EXAMPLE = REPO / "deploy" / "examples" / "serve-snapshot.yaml"
RECORDED_ENV = {"PATH": "/usr/bin", "VLLM_LOGGING_LEVEL": "INFO"}


def _gpu_key() -> CacheKey:
    (target,) = plan_targets(load_spec(REPO / "images" / "qwen3-0.6b.yaml"), ["h100"], registry="r")
    return target.key


def _snapshot_key(base: str, cache_key: CacheKey, args: list[str], env: Mapping[str, str]) -> SnapshotKey:
    return cpu_key(image=base, cache_key=cache_key, serve_args=json.dumps(args), serve_env=env_digest(env))


@dataclasses.dataclass(frozen=True)
class Image:
    digest: str = DIGEST
    key: CacheKey = dataclasses.field(default_factory=lambda: cpu_key().cache_key)


def _snap(
    base: str = DIGEST,
    *,
    args: list[str] | None = None,
    env: Mapping[str, str] | None = RECORDED_ENV,
    cache_key: CacheKey | None = None,
) -> VerifiedSnapshotVolume:
    key = cache_key or cpu_key().cache_key
    return VerifiedSnapshotVolume(
        reference="reg.example/kb/tiny@" + "sha256:" + "5" * 64,
        digest="sha256:" + "5" * 64,
        key=key,
        signer="ci@example.com",
        base_digest=base,
        manifest_digest=SNAP_JSON,
        snapshot_key=_snapshot_key(base, key, args or [], env or {}),
        environment=env,
    )


def _pod(
    caps: list[str] | None = None,
    *,
    mount: str | None = SNAPSHOT_ROOT,
    seccomp: str = "Unconfined",
    **sc: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "engine",
        "image": IMAGE,
        "securityContext": {
            "capabilities": {"add": caps if caps is not None else ["SYS_ADMIN", "NET_ADMIN", "SYS_TIME"]},
            "seccompProfile": {"type": seccomp},
            **sc,
        },
    }
    if mount is not None:
        container["volumeMounts"] = [{"name": "snapshot", "mountPath": mount}]
    return {"containers": [container], "volumes": [{"name": "snapshot", "image": {"reference": "x"}}]}


def decide_snapshots(
    pod: dict[str, Any],
    snapshots: dict[str, Any],
    images: dict[str, Any],
    *,
    mutate: bool,
    governed: set[str] | None = None,
) -> Verdict:
    """The rule's pure core on the pod spec ``pod`` (walked as admission walks it)."""
    return snapshot_restore.decide(walk(("spec",), pod), snapshots, images, governed=governed, mutate=mutate)


def _decide(
    pod: dict[str, Any],
    snap: VerifiedSnapshotVolume | None = None,
    image: Image | None = Image(),
    mutate: bool = True,
    governed: set[str] | None = None,
) -> Any:
    snapshots = {"snapshot": snap or _snap()} if snap is not False else {}
    return decide_snapshots(pod, snapshots, {IMAGE: image} if image else {}, mutate=mutate, governed=governed)


def test_a_restore_of_the_images_own_snapshot_is_admitted_and_pinned() -> None:
    d = _decide(_pod())
    assert d.problems == ()
    assert [op["value"] for op in d.patch] == [
        [{"name": SNAPSHOT_DIGEST_ENV, "value": SNAP_JSON}],
        {"name": IMAGE_DIGEST_ENV, "value": DIGEST},
    ]
    assert d.notes == (
        f'container "engine": restore of snapshot {SNAP_JSON} admitted with NET_ADMIN, SYS_ADMIN, SYS_TIME',
    )


def test_capabilities_without_a_verified_snapshot_are_refused() -> None:
    problems = decide_snapshots(_pod(), {}, {IMAGE: Image()}, mutate=True).problems
    # The volume at the snapshot root did not verify as a snapshot: named too.
    assert [
        ("mounts 0 verified snapshots" in p, "volume 'snapshot' is mounted at" in p) for p in problems
    ] == [
        (False, True),
        (True, False),
    ]


def test_a_snapshot_of_another_image_or_cache_key_is_refused() -> None:
    (problem,) = _decide(_pod(), image=Image(digest=OTHER)).problems
    assert f"taken from {DIGEST}, but the container runs {OTHER}" in problem
    (problem,) = _decide(_pod(), image=None).problems
    assert f"taken from {DIGEST}, but the container runs '{IMAGE}'" in problem
    (problem,) = _decide(_pod(), snap=_snap(cache_key=_gpu_key())).problems
    assert f"the snapshot's cache key is {_gpu_key().digest}" in problem


def test_a_capability_beyond_the_set_or_privileged_is_refused() -> None:
    (problem,) = _decide(_pod(["SYS_ADMIN", "NET_ADMIN", "SYS_TIME", "CAP_SYS_MODULE"])).problems
    assert "adds SYS_MODULE beyond the restore set" in problem
    (problem,) = _decide(_pod(privileged=True)).problems
    # The whole set the recipe adds after dropping ALL, not only the three a runtime withholds.
    assert "a restore needs only NET_ADMIN, SETGID, SYS_ADMIN, SYS_CHROOT, SYS_TIME (drop ALL" in problem


def test_unconfined_seccomp_alone_asks_too() -> None:
    problems = decide_snapshots(_pod([]), {}, {IMAGE: Image()}, mutate=True).problems
    assert any("asks for the restore capabilities" in p for p in problems)
    assert decide_snapshots(
        _pod([], seccomp="RuntimeDefault"), {}, {IMAGE: Image()}, mutate=True
    ).problems == (problems[0],), "without Unconfined only the volume at the root is named"


def test_a_snapshot_mounted_elsewhere_in_part_or_under_another_volume_is_refused() -> None:
    (problem,) = _decide(_pod(mount="/snap")).problems
    assert f"serve restores only from {SNAPSHOT_ROOT}" in problem
    pod = _pod()
    pod["containers"][0]["volumeMounts"][0]["subPath"] = "images"
    assert any("mounted in part (subPath)" in p for p in _decide(pod).problems)
    pod = _pod()
    pod["containers"][0]["volumeMounts"].append(
        {"name": "junk", "mountPath": SNAPSHOT_ROOT + "//images/pages-1.img"}
    )
    (problem,) = _decide(pod).problems
    assert "volume 'junk' is mounted at" in problem and "only a verified snapshot's image volume" in problem


def test_the_pins_are_admissions_alone() -> None:
    pod = _pod([], seccomp="RuntimeDefault", mount=None)
    pod["containers"][0]["env"] = [{"name": SNAPSHOT_DIGEST_ENV, "value": SNAP_JSON}]
    (problem,) = _decide(pod).problems
    assert f"sets ${SNAPSHOT_DIGEST_ENV} without the restore it pins" in problem
    pod = _pod()
    pod["containers"][0]["env"] = [{"name": SNAPSHOT_DIGEST_ENV, "value": OTHER}]
    (problem,) = _decide(pod).problems
    assert f"${SNAPSHOT_DIGEST_ENV} is '{OTHER}', the verified one is {SNAP_JSON}" in problem


def test_a_pod_that_asks_for_nothing_is_left_alone() -> None:
    pod = _pod([], seccomp="RuntimeDefault", mount=None)
    assert _decide(pod) == decide_snapshots(pod, {}, {}, mutate=True)
    assert _decide(pod).problems == () and _decide(pod).patch == ()


def test_serve_args_must_be_the_recorded_ones() -> None:
    pod = _pod()
    pod["containers"][0]["args"] = ["--max-num-seqs", "64"]
    (problem,) = _decide(pod).problems
    assert 'serve args ["--max-num-seqs", "64"] here, [] recorded; serve would start baked' in problem
    assert _decide(pod, snap=_snap(args=["--max-num-seqs", "64"])).problems == ()
    pod["containers"][0]["command"] = ["python3", "-m", "vllm"]
    (problem,) = _decide(pod, snap=_snap(args=["--max-num-seqs", "64"])).problems
    assert "sets command; a restore runs the image's entrypoint" in problem
    pod = _pod()
    pod["containers"][0]["args"] = ["--max-num-seqs", "$(SEQS)"]
    (problem,) = _decide(pod, snap=_snap(args=["--max-num-seqs", "$(SEQS)"])).problems
    assert "args refer to variables ($(NAME))" in problem


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ([{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}], "$VLLM_LOGGING_LEVEL differs from the value"),
        ([{"name": "HF_TOKEN", "value": "x"}], "$HF_TOKEN is set here, and was not when the snapshot"),
        (
            [{"name": "VLLM_LOGGING_LEVEL", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}],
            "$VLLM_LOGGING_LEVEL comes from valueFrom, which admission cannot read",
        ),
    ],
)
def test_a_variable_that_is_not_the_recorded_one_is_refused(env: list[dict[str, Any]], why: str) -> None:
    pod = _pod()
    pod["containers"][0]["env"] = env
    (problem,) = _decide(pod).problems
    assert why in problem


def test_variables_the_key_leaves_out_and_recorded_ones_pass_and_env_from_does_not() -> None:
    pod = _pod()
    pod["containers"][0]["env"] = [
        {"name": "VLLM_LOGGING_LEVEL", "value": "INFO"},
        {"name": "KERNELBAKE_SNAPSHOT_MARKS", "value": "/marks"},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "GPU-1"},
    ]
    assert _decide(pod).problems == ()
    pod["containers"][0]["envFrom"] = [{"configMapRef": {"name": "c"}}]
    (problem,) = _decide(pod).problems
    assert "envFrom brings variables admission cannot read" in problem
    (problem,) = _decide(_pod(), snap=_snap(env=None)).problems
    assert "records no environment (taken by an older kernelbake)" in problem


def test_a_host_path_or_an_ephemeral_container_gets_no_restore() -> None:
    pod = _pod()
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/var/lib"}})
    (problem,) = _decide(pod).problems
    assert "in a pod with hostPath volumes (host)" in problem
    pod = _pod()
    pod["ephemeralContainers"] = [dict(pod["containers"][0], name="debug")]
    (problem,) = _decide(pod).problems
    assert 'ephemeral container "debug": asks for the restore capabilities' in problem


@pytest.mark.parametrize(
    ("field", "says"),
    [
        ("hostPID", "SYS_ADMIN over the node's processes is the node's root"),
        ("hostNetwork", "NET_ADMIN would change the node's network"),
        ("hostIPC", "SYS_ADMIN would reach the node's IPC objects"),
        ("shareProcessNamespace", "the other containers' processes share the pids the snapshot's tree needs"),
    ],
)
def test_a_namespace_shared_with_the_node_or_other_containers_gets_no_restore(field: str, says: str) -> None:
    pod = _pod()
    pod[field] = False
    assert _decide(pod).problems == ()
    pod[field] = True
    (problem,) = _decide(pod).problems
    assert f"asks for the restore capabilities in a pod with {field}: true; {says}" in problem


def test_a_container_of_an_ungoverned_image_is_not_judged_unless_it_touches_a_snapshot() -> None:
    pod = _pod(mount=None)
    pod["containers"][0]["image"] = "docker.io/library/busybox:1"
    assert _decide(pod, governed={IMAGE}).problems == ()
    pod = _pod()
    pod["containers"][0]["image"] = "docker.io/library/busybox:1"
    (problem,) = _decide(pod, governed={IMAGE}).problems
    assert "but the container runs 'docker.io/library/busybox:1'" in problem


# The webhook: the example's image and its snapshot, as the gateway verifies them.


def _example() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return doc


def _spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec


class Verifier:
    def __init__(self, doc: dict[str, Any], **snapshot: Any) -> None:
        spec = _spec(doc)
        self.image = spec["containers"][0]["image"]
        self.snapshot_ref = next(v for v in spec["volumes"] if "image" in v)["image"]["reference"]
        self.snapshot_digest = digest_of(self.snapshot_ref)
        self.key = _gpu_key()
        self.snapshot = {"base": self.image.split("@")[1], "cache_key": self.key, **snapshot}

    def __call__(self, reference: str) -> Any:
        ref = parse_reference(reference)
        if reference == self.image:
            return Verified(
                FakeVerified(reference, ref.name, ref.digest, self.key, digest_of("m"), "ci@example.com", {})
            )
        if reference in (self.snapshot_ref, f"{ref.name}@{self.snapshot_digest}"):
            return Snapshot(
                dataclasses.replace(
                    _snap(
                        self.snapshot["base"],
                        cache_key=self.snapshot["cache_key"],
                        args=self.snapshot.get("args"),
                        env=self.snapshot.get("env", {}),
                    ),
                    reference=reference,
                    digest=self.snapshot_digest,
                )
            )
        raise ImageRejected(f"{reference} has no signature from a trusted identity")


def _review(doc: dict[str, Any], verifier: Any, endpoint: Endpoint = Endpoint.MUTATE) -> dict[str, Any]:
    admitter = make_admitter(verifier, make_policy())
    try:
        answer: dict[str, Any] = admitter.review(documents.review_of(doc), endpoint)
    finally:
        admitter.gateway.close()
    return answer["response"]


def test_the_deploy_recipe_is_admitted_through_the_webhook_with_the_restore_pinned() -> None:
    doc = _example()
    verifier = Verifier(doc)
    response = _review(doc, verifier)
    assert response["allowed"], response.get("status")
    patched = _spec(
        jsonpatch.apply_patch(copy.deepcopy(doc), json.loads(base64.b64decode(response["patch"])))
    )
    engine = patched["containers"][0]
    pins = {
        e["name"]: e["value"] for e in engine["env"] if e["name"] in (SNAPSHOT_DIGEST_ENV, IMAGE_DIGEST_ENV)
    }
    assert pins == {SNAPSHOT_DIGEST_ENV: SNAP_JSON, IMAGE_DIGEST_ENV: verifier.image.split("@")[1]}
    snapshot = next(v for v in patched["volumes"] if v["name"] == "snapshot")
    assert (
        snapshot["image"]["reference"]
        == f"{parse_reference(verifier.snapshot_ref).name}@{verifier.snapshot_digest}"
    )
    assert any("restore of snapshot" in w for w in response.get("warnings", []))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda c: c["securityContext"]["capabilities"]["add"].append("SYS_PTRACE"), "adds SYS_PTRACE"),
        (lambda c: c.update(args=["--max-num-seqs", "64"]), "serve args"),
        (lambda c: c["env"].append({"name": "HF_HOME", "value": "/x"}), "$HF_HOME is set here"),
        (
            lambda c: c.update(volumeMounts=[m for m in c["volumeMounts"] if m["name"] != "snapshot"]),
            "mounts 0",
        ),
    ],
)
def test_the_webhook_denies_the_recipe_changed_with_the_reason(change: Any, why: str) -> None:
    doc = _example()
    change(_spec(doc)["containers"][0])
    for endpoint in Endpoint:
        response = _review(doc, Verifier(_example()), endpoint)
        assert not response["allowed"] and why in response["status"]["message"]


def test_the_webhook_denies_a_snapshot_of_another_image_and_one_that_does_not_verify() -> None:
    doc = _example()
    response = _review(doc, Verifier(doc, base=OTHER))
    assert not response["allowed"]
    assert f"the snapshot was taken from {OTHER}" in response["status"]["message"]
    verifier = Verifier(doc)
    verifier.snapshot_ref = "registry.example.com/kernelbake/other:x"
    response = _review(doc, verifier)
    assert not response["allowed"]
    assert "has no signature from a trusted identity" in response["status"]["message"]
    assert "mounts 0 verified snapshots" in response["status"]["message"]


def test_the_webhook_denies_restore_capabilities_on_a_governed_image_without_a_snapshot() -> None:
    doc = _example()
    spec = _spec(doc)
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "snapshot"]
    spec["containers"][0]["volumeMounts"] = [
        m for m in spec["containers"][0]["volumeMounts"] if m["name"] != "snapshot"
    ]
    response = _review(doc, Verifier(_example()))
    assert not response["allowed"]
    assert (
        "asks for the restore capabilities but mounts 0 verified snapshots" in response["status"]["message"]
    )


def test_the_real_verifier_verifies_a_pushed_snapshot_as_a_volume(tmp_path: Path) -> None:
    from kernelbake.admission.verifying import SignedImageVerifier
    from kernelbake.oci import RegistryClient
    from kernelbake.settings import Settings
    from kernelbake.signing.keys import generate_key_pair, load_private_key
    from kernelbake.signing.policy import VerifyPolicy
    from kernelbake.signing.sign import sign_image
    from kernelbake.signing.signer import KeySigner
    from kernelbake.signing.snapshot import push_snapshot
    from tests.signing.images import push_image
    from tests.signing.test_snapshot import _dir
    from tests.support.memregistry import memory_registry

    with memory_registry() as (addr, _store):
        client = RegistryClient(Settings(docker_config=tmp_path / "docker"), timeout=10.0)
        private, public = generate_key_pair(tmp_path / "k", name="kb")
        foreign, _ = generate_key_pair(tmp_path / "f", name="other")
        signer = KeySigner(load_private_key(private))
        base = push_image(client, f"{addr}/kb/base:v1", tmp_path / "img")
        sign_image(base.pinned, signer, client=client)
        pushed = push_snapshot(_dir(tmp_path, base), base=base.pinned, signer=signer, client=client)
        for required in (True, False):
            trust = VerifyPolicy.from_mapping(
                {"keys": [str(public)], "require_attestation": required}, source="t"
            )
            verifier = SignedImageVerifier(trust, client_factory=lambda: client)
            found = verifier(pushed.reference)
            assert isinstance(found, Snapshot) and isinstance(found.verified, VerifiedSnapshotVolume)
            got = found.verified
            assert (got.base_digest, got.manifest_digest, got.key) == (
                base.digest,
                pushed.manifest_digest,
                base.key,
            )
            assert got.environment is None, "the fixture's snapshot.json records none"
        # Another snapshot of the same image (other bytes), signed by a key the policy does not trust.
        snap = _dir(tmp_path / "b", base)
        manifest = SnapshotManifest.from_json((snap / SNAPSHOT_MANIFEST).read_bytes(), source="t")
        (snap / SNAPSHOT_MANIFEST).write_text(dataclasses.replace(manifest, deadline_s=31.0).to_json())
        other = push_snapshot(
            snap,
            base=base.pinned,
            signer=KeySigner(load_private_key(foreign)),
            client=client,
            to=f"{addr}/kb/base:foreign-snapshot",
        )
        with pytest.raises(ImageRejected):
            verifier(other.reference)


@pytest.mark.parametrize(
    "junk",
    [
        {"securityContext": []},
        {"securityContext": {"capabilities": 7, "seccompProfile": "Unconfined"}},
        {"securityContext": {"capabilities": {"add": "SYS_ADMIN"}}, "env": {"a": 1}},
        {"volumeMounts": 3, "env": [[1], {"name": ["x"]}], "args": {"a": 1}},
    ],
)
def test_junk_shapes_are_judged_as_absent_without_a_traceback(junk: dict[str, Any]) -> None:
    pod = _pod()
    pod["containers"][0].update(junk)
    pod["securityContext"] = ["junk"]
    decision = _decide(pod)
    assert isinstance(decision.problems, tuple)
    # Volumes that are no list are no pod spec the walk reads: malformed (code 400), no traceback.
    pod["volumes"] = "junk"
    with pytest.raises(MalformedObject, match="volumes must be a list"):
        _decide(pod)


def test_privileged_asks_for_the_restore_set_and_no_privileged_sibling_may_stand_beside_a_restore() -> None:
    pod = _pod([], seccomp="RuntimeDefault", privileged=True)
    problems = decide_snapshots(pod, {}, {IMAGE: Image()}, mutate=True, governed={IMAGE}).problems
    assert any("privileged grants every capability" in p for p in problems)
    pod = _pod()
    pod["containers"].append(
        {"name": "helper", "image": "docker.io/library/busybox:1", "securityContext": {"privileged": True}}
    )
    (problem,) = _decide(pod, governed={IMAGE}).problems
    assert problem.startswith('container "helper": privileged beside a snapshot restore')
    pod["containers"][1]["securityContext"]["privileged"] = False
    assert _decide(pod, governed={IMAGE}).problems == ()
