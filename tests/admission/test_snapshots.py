"""Restore capabilities are admitted only for a verified snapshot of the container's own image,
with nothing beyond the measured set; the pins serve trusts are set by admission alone."""

from __future__ import annotations

import dataclasses
from typing import Any

from kernelbake.admission.snapshots import decide_snapshots
from kernelbake.contract.snapshot import IMAGE_DIGEST_ENV, SNAPSHOT_DIGEST_ENV, SNAPSHOT_ROOT

IMAGE = "reg.example/kb/tiny@sha256:" + "1" * 64
DIGEST = "sha256:" + "1" * 64
OTHER = "sha256:" + "2" * 64
SNAP_JSON = "sha256:" + "3" * 64


@dataclasses.dataclass(frozen=True)
class Snap:
    base_digest: str = DIGEST
    manifest_digest: str = SNAP_JSON


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


def _decide(
    pod: dict[str, Any], snap: Snap | None = Snap(), digest: str = DIGEST, mutate: bool = True
) -> Any:
    return decide_snapshots(pod, {"snapshot": snap} if snap else {}, {IMAGE: digest}, mutate=mutate)


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
    (problem,) = _decide(_pod(), snap=None).problems
    assert "mounts 0 verified snapshots" in problem


def test_a_snapshot_of_another_image_is_refused() -> None:
    (problem,) = _decide(_pod(), digest=OTHER).problems
    assert f"taken from {DIGEST}, but the container runs {OTHER}" in problem


def test_a_capability_beyond_the_set_or_privileged_is_refused() -> None:
    (problem,) = _decide(_pod(["SYS_ADMIN", "NET_ADMIN", "SYS_TIME", "CAP_SYS_MODULE"])).problems
    assert "adds SYS_MODULE beyond the restore set" in problem
    (problem,) = _decide(_pod(privileged=True)).problems
    assert "privileged grants every capability" in problem


def test_unconfined_seccomp_alone_asks_too() -> None:
    (problem,) = _decide(_pod([]), snap=None).problems
    assert "asks for the restore capabilities" in problem


def test_a_snapshot_mounted_elsewhere_is_refused() -> None:
    (problem,) = _decide(_pod(mount="/snap")).problems
    assert f"serve restores only from {SNAPSHOT_ROOT}" in problem


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


def test_the_deploy_recipe_is_admitted_as_it_stands() -> None:
    import yaml

    from tests.conftest import REPO

    doc = yaml.safe_load((REPO / "deploy/examples/serve-snapshot.yaml").read_text())
    spec = doc["spec"]["template"]["spec"]
    image = spec["containers"][0]["image"]
    digest = image.partition("@")[2]
    d = decide_snapshots(spec, {"snapshot": Snap(base_digest=digest)}, {image: digest}, mutate=True)
    assert d.problems == ()
    assert [op["value"] for op in d.patch] == [
        {"name": SNAPSHOT_DIGEST_ENV, "value": SNAP_JSON},
        {"name": IMAGE_DIGEST_ENV, "value": digest},
    ]
    # The same pod with a capability more is not.
    spec["containers"][0]["securityContext"]["capabilities"]["add"].append("SYS_PTRACE")
    assert (
        "adds SYS_PTRACE"
        in decide_snapshots(
            spec, {"snapshot": Snap(base_digest=digest)}, {image: digest}, mutate=True
        ).problems[0]
    )
