"""The gate skips a snapshot's sha256 only on an image volume the runtime pulled: a read-only
overlay of layers alone, nothing mounted inside; anything else is hashed whole (the gate's side:
tests/runtime/snapshot/test_gate.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbake.runtime.snapshot import volume

ROOT = "/opt/kernelbake/snapshot"
BASE = "1 0 0:30 / / rw,relatime - overlay overlay rw,lowerdir=/l1:/l2,upperdir=/u,workdir=/w\n"
# What containerd gives a two-layer image volume, bound into the container read-only.
PULLED = f"2 1 0:40 / {ROOT} ro,nosuid,nodev,relatime - overlay overlay ro,lowerdir=/v/2/fs:/v/1/fs\n"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (BASE, "nothing mounted there"),
        (BASE + PULLED.replace(" ro,nosuid", " rw,nosuid"), "mounted read-write"),
        (
            BASE + PULLED.replace("lowerdir=/v/2/fs:/v/1/fs", "lowerdir=/v/1/fs,upperdir=/u2,workdir=/w2"),
            "an upper layer",
        ),
        (BASE + f"2 1 253:1 /snaps/x {ROOT} ro,relatime - ext4 /dev/vda ro\n", "a bind mount of a directory"),
        (
            BASE + PULLED + f"3 2 0:50 / {ROOT}/images/pages-1.img ro - tmpfs tmpfs rw\n",
            "a file mounted inside",
        ),
        (BASE + PULLED + f"3 1 0:51 / {ROOT} rw - tmpfs tmpfs rw\n", "another mount on top"),
        (BASE + "garbage line\n", "junk"),
    ],
)
def test_only_a_read_only_overlay_of_pulled_layers_skips_the_hash(text: str, why: str) -> None:
    assert volume.pulled_by_runtime(Path(ROOT), text) is None, why


def test_the_image_volume_as_the_runtime_mounts_it_skips_the_hash() -> None:
    assert volume.pulled_by_runtime(Path(ROOT + "/"), BASE + PULLED) == (
        "a read-only overlay of the layers the runtime pulled by digest"
    )
    escaped = PULLED.replace(ROOT, "/opt/kernel\\040bake")
    assert volume.pulled_by_runtime(Path("/opt/kernel bake"), BASE + escaped) is not None
