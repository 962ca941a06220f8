"""bench/memory_cgroup.py: the limit the adversarial bench puts the webhook under is a real one
(a process that needs more is OOM-killed, one that fits runs), or it says why there is none."""

from __future__ import annotations

import subprocess
import sys

from tests.support import bench

LIMIT = 64 * 1024 * 1024
# Touches every page of N MiB, so they are resident (and charged to the cgroup).
TOUCH = "import sys; b = bytearray(int(sys.argv[1]) << 20); b[::4096] = b'x' * len(b[::4096]); print('ok')"


def test_a_process_over_the_limit_is_killed_and_one_under_it_runs() -> None:
    cgroup = bench.load("memory_cgroup")
    with cgroup.limited(LIMIT, name="kernelbake-test-memcg") as limit:
        if not limit.enforced:
            # No cgroup here (no root, read-only /sys/fs/cgroup): it says so, and claims nothing.
            assert limit.why and limit.wrap == ()
            assert limit.stats() == {
                "enforced": False,
                "limit_bytes": LIMIT,
                "cgroup_version": None,
                "why_not": limit.why,
            }
            return
        under = subprocess.run(
            [*limit.wrap, sys.executable, "-c", TOUCH, "16"], capture_output=True, text=True
        )
        over = subprocess.run(
            [*limit.wrap, sys.executable, "-c", TOUCH, "256"], capture_output=True, text=True
        )
        stats = limit.stats()
    assert (under.returncode, under.stdout.strip()) == (0, "ok"), under.stderr
    assert over.returncode == -9, (over.returncode, over.stderr)
    assert stats["enforced"] is True and stats["limit_hit"] >= 1
    # The peak is the cgroup's own figure: near the limit, never past it.
    assert isinstance(stats["peak_usage_bytes"], int) and stats["peak_usage_bytes"] <= LIMIT
    if stats["oom_kills"] is not None:  # older v1 kernels do not count them
        assert stats["oom_kills"] >= 1
