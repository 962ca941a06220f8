"""Run a command in which no process can make an io_uring: ``io_uring_setup`` fails with ENOSYS.

    python3 bench/no_io_uring.py -- CMD...

CRIU cannot dump an io_uring, and a vLLM server holds one in each of its processes unless the
kernel refuses the call. This is the filter ``kernelbake snapshot take`` puts on the engine
(kernelbake.runtime.snapshot.io_uring, which says why), for a bench that starts vLLM itself
(bench/vllm_snapshot_restore.py on the device machine, where there is no container runtime
and so no default seccomp profile).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from kernelbake.runtime.snapshot import io_uring


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: no_io_uring.py -- CMD...", file=sys.stderr)
        return 2
    cmd = argv[argv.index("--") + 1 :]
    io_uring.deny()
    os.execvp(cmd[0], cmd)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
