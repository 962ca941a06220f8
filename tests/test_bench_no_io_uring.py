"""bench/no_io_uring.py: under it, no process of the tree can set up an io_uring (what CRIU
cannot dump), children included, and the kernel's answer is the one libraries fall back on."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "no_io_uring.py"
# io_uring_setup(4, params) on x86_64: a ring's fd, or -1 with errno.
PROBE = (
    "import ctypes; libc = ctypes.CDLL(None, use_errno=True); p = ctypes.create_string_buffer(120); "
    "r = libc.syscall(425, 4, p); print(r, ctypes.get_errno())"
)


def _probe(*prefix: str) -> tuple[int, int]:
    out = subprocess.run([*prefix, sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    ret, err = out.stdout.split()
    return int(ret), int(err)


def test_the_ring_is_refused_with_enosys_in_the_command_and_its_children() -> None:
    wrap = (sys.executable, str(SCRIPT), "--")
    assert _probe(*wrap) == (-1, errno.ENOSYS)
    # A grandchild through a shell: the filter is inherited across fork and exec.
    assert _probe(*wrap, "sh", "-c", '"$0" "$@"') == (-1, errno.ENOSYS)


def test_without_it_the_probe_reaches_the_kernel() -> None:
    # The control: outside the filter the answer is the kernel's (a ring's fd here; EPERM under a
    # container's default seccomp profile), never our ENOSYS, unless the kernel has io_uring off.
    disabled = Path("/proc/sys/kernel/io_uring_disabled")
    if disabled.exists() and disabled.read_text().strip() == "2":
        assert _probe() == (-1, errno.EPERM)
    else:
        assert _probe() != (-1, errno.ENOSYS)


def test_a_missing_command_is_a_usage_error() -> None:
    p = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 2 and "usage" in p.stderr
