"""GPU 0 as torch sees it, printed as one JSON line: ``[name, [major, minor], cuda]``, or
``[null, null, cuda]`` without a GPU. Run as a child process by ``probe.cuda_device`` so that
the process asking (serve's supervisor) never initialises CUDA itself."""

from __future__ import annotations

import json


def main() -> None:
    import torch

    cuda = torch.version.cuda
    if not torch.cuda.is_available():
        print(json.dumps([None, None, cuda]))
        return
    major, minor = torch.cuda.get_device_capability(0)
    print(json.dumps([torch.cuda.get_device_name(0), [major, minor], cuda]))


if __name__ == "__main__":
    main()
