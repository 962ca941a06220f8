"""No io_uring in a tree that is to be snapshotted: a seccomp filter, installed in the child
before it execs the engine, makes ``io_uring_setup`` fail with ENOSYS.

CRIU cannot dump an io_uring ("Unknown shit 600 (anon_inode:[io_uring])"), and vLLM's API
server and engine core each set one up: libuv (uvloop's, and torch's in the TCPStore) makes one
when its loop starts whatever ``UV_USE_IO_URING`` says (that covers only its file-operation
ring). Each library falls back to epoll on ENOSYS, as on a kernel without io_uring. Docker's
default seccomp profile refuses the call already (EPERM), but CRIU needs ``seccomp=unconfined``,
and then the engine would get its rings. The filter is inherited across fork and exec, and
CRIU dumps and restores it with each process. (The lead's recipe, bench/no_io_uring.py.)"""

from __future__ import annotations

import ctypes
import struct

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_AUDIT_ARCH_X86_64 = 0xC000003E
_NR_IO_URING_SETUP = 425  # x86_64 and the generic table alike
_X32_BIT = 0x40000000
_ENOSYS = 38
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_LD_ABS_W, _JEQ_K, _RET_K = 0x20, 0x15, 0x06


def program() -> bytes:
    """The classic-BPF filter: on x86_64, io_uring_setup (also its x32 number) → ENOSYS."""
    ins = [
        (_LD_ABS_W, 0, 0, 4),  # seccomp_data.arch
        (_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
        (_RET_K, 0, 0, _RET_ALLOW),  # another ABI: leave it alone
        (_LD_ABS_W, 0, 0, 0),  # seccomp_data.nr
        (_JEQ_K, 1, 0, _NR_IO_URING_SETUP),
        (_JEQ_K, 0, 1, _NR_IO_URING_SETUP | _X32_BIT),
        (_RET_K, 0, 0, _RET_ERRNO | _ENOSYS),
        (_RET_K, 0, 0, _RET_ALLOW),
    ]
    return b"".join(struct.pack("HBBI", *i) for i in ins)


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def deny() -> None:
    """Install the filter in this process (a child's ``preexec_fn``, before exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    code = program()
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _Prog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
