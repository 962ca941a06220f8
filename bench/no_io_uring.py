"""Run a command in which no process can make an io_uring: ``io_uring_setup`` fails with ENOSYS.

    python3 bench/no_io_uring.py -- CMD...

CRIU cannot dump an io_uring, and a vLLM server holds one in each of its processes: libuv
(uvloop's in the API server, torch's in the TCPStore of the engine core) sets one up when its
loop starts, whatever ``UV_USE_IO_URING`` says (that variable covers only its file-operation
ring, not the one that batches epoll_ctl). Every such library falls back to epoll when the
kernel answers ENOSYS, as on a kernel without io_uring, so a seccomp filter that gives that
answer removes the rings from the whole tree without touching any library. Docker's and
containerd's default seccomp profiles already refuse io_uring_setup (with EPERM), so a serving
container is in this state anyway; this makes a bare machine match it. The filter is
inherited across fork and exec, and CRIU dumps and restores it with the process.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
NR_IO_URING_SETUP = 425  # x86_64 and the generic table alike
X32_BIT = 0x40000000
ENOSYS = 38
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
# BPF opcodes: ld w abs, jeq k, ret k.
LD_ABS_W, JEQ_K, RET_K = 0x20, 0x15, 0x06


def _program() -> bytes:
    ins = [
        (LD_ABS_W, 0, 0, 4),  # seccomp_data.arch
        (JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        (RET_K, 0, 0, RET_ALLOW),  # another ABI: leave it alone
        (LD_ABS_W, 0, 0, 0),  # seccomp_data.nr
        (JEQ_K, 1, 0, NR_IO_URING_SETUP),
        (JEQ_K, 0, 1, NR_IO_URING_SETUP | X32_BIT),
        (RET_K, 0, 0, RET_ERRNO | ENOSYS),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    return b"".join(struct.pack("HBBI", *i) for i in ins)


def install() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    code = _program()
    buf = ctypes.create_string_buffer(code, len(code))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: no_io_uring.py -- CMD...", file=sys.stderr)
        return 2
    cmd = argv[argv.index("--") + 1 :]
    install()
    os.execvp(cmd[0], cmd)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
