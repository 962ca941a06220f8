"""The mounts at a root ``serve`` trusts as one verified volume's (``rules.roots``), which the
delta and snapshot rules both judge."""

from __future__ import annotations

from typing import Any

from kernelbake.admission.pod import Container, walk
from kernelbake.admission.rules.roots import root_mounts

ROOT = "/opt/kernelbake/thing"


def _container(*mounts: dict[str, Any]) -> Container:
    pod = walk(("spec",), {"containers": [{"name": "c", "image": "i", "volumeMounts": list(mounts)}]})
    return pod.containers[0]


def test_only_a_verified_volume_whole_belongs_at_the_root() -> None:
    c = _container(
        {"name": "ok", "mountPath": ROOT},
        {"name": "stranger", "mountPath": f"{ROOT}/sub"},
        # Resolved as the container resolves it: inside the root.
        {"name": "sneaky", "mountPath": "/opt/other/../kernelbake/thing/x"},
        {"name": "part", "mountPath": ROOT, "subPath": "a"},
        {"name": "elsewhere", "mountPath": "/data"},
    )
    ours, problems = root_mounts(c, {"ok", "part"}, ROOT, what="thing", use="reads a thing")
    assert [m.name for m in ours] == ["ok", "part"]
    assert [str(d) for d in problems] == [
        f"container \"c\": volume 'stranger' is mounted at '{ROOT}/sub', where serve reads a thing; "
        "only a verified thing's image volume belongs there, whole",
        "container \"c\": volume 'sneaky' is mounted at '/opt/other/../kernelbake/thing/x', where serve "
        "reads a thing; only a verified thing's image volume belongs there, whole",
        f"container \"c\": thing 'part' is mounted in part (subPath); mount it at {ROOT} whole",
    ]


def test_a_verified_volume_is_returned_wherever_it_is_mounted_for_the_rule_to_judge() -> None:
    # Where it is mounted is the rule's to say (the delta and snapshot rules word it differently).
    c = _container({"name": "ok", "mountPath": "/data"}, {"name": "other", "mountPath": "/etc/x"})
    ours, problems = root_mounts(c, {"ok"}, ROOT, what="thing", use="reads a thing")
    assert ([m.name for m in ours], problems) == (["ok"], [])
