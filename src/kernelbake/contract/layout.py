"""Where things are in every kernelbake image: the paths the host renders into the Dockerfile
and reads back from pushed images, and the code in the image reads and writes.

    /opt/kernelbake/target.json             } serve's root of trust (``TRUSTED_FILES``)
    /opt/kernelbake/pinned-manifest.json    } a copy of the cache manifest, outside the cache root
    /opt/kernelbake/cache/manifest.json
    /opt/kernelbake/cache/<kind>/...        e.g. inductor/, triton/, vllm/, flashinfer/
"""

from __future__ import annotations

import enum
from pathlib import Path

# The directory of the files serve trusts; the cache root lies inside it, but they do not lie
# inside the cache root, so a volume at the cache root (a documented recipe) cannot move them.
TRUST_DIR = "/opt/kernelbake"
TARGET_FILE = f"{TRUST_DIR}/target.json"
# Where caches live in every image, at compile and at serve time alike: FlashInfer's JIT
# cache embeds absolute paths, so this path is part of the contract, not a detail.
CACHE_ROOT = "/opt/kernelbake/cache"
MANIFEST = "manifest.json"
# Where the cache manifest lives in every kernelbake image, and the only file its last layer holds.
CACHE_MANIFEST_PATH = f"{CACHE_ROOT.lstrip('/')}/{MANIFEST}"
# The same bytes again, beside target.json and outside the cache root, in a layer of their own
# that the image's signature covers like every other. A volume mounted over the cache root
# (the read-only recipe, a seeded emptyDir) replaces the manifest there but not this copy, so
# the runtime ties the manifest it finds to the one this image was built with.
PINNED_MANIFEST_NAME = "pinned-manifest.json"
PINNED_MANIFEST = f"{TRUST_DIR}/{PINNED_MANIFEST_NAME}"

# What ``kernelbake serve`` takes on trust from the image: the key and serve settings
# (target.json) and the manifest every cache file is checked against. It reads them at these
# fixed paths only, and starts warm only while no mount of the pod covers them
# (``runtime.trusted``); admission denies a pod spec that mounts at or above one of them
# (``admission.trusted_paths``).
TRUSTED_FILES = (TARGET_FILE, PINNED_MANIFEST)
# Moves the trusted files to the directory of the target.json it names, for tests and
# benchmarks that run the runtime outside an image: the files are then checked for nothing
# (neither mounts nor owners) and every verdict says so. Admission denies a pod that sets it.
UNSAFE_TARGET_ENV = "KERNELBAKE_UNSAFE_TARGET"
# The variable that moved them before (issue 32): refused by the runtime, denied by admission.
RETIRED_TARGET_ENV = "KERNELBAKE_TARGET"
TRUSTED_VARIABLES = (UNSAFE_TARGET_ENV, RETIRED_TARGET_ENV)


class CacheKind(enum.Enum):
    INDUCTOR = "inductor"  # TORCHINDUCTOR_CACHE_DIR (FX graph, AOTAutograd, compiled C++/PTX)
    TRITON = "triton"  # TRITON_CACHE_DIR
    VLLM = "vllm"  # VLLM_CACHE_ROOT (torch.compile artifacts, AOT)
    FLASHINFER = "flashinfer"  # FLASHINFER_WORKSPACE_BASE (JIT modules, autotune)
    DEEPGEMM = "deepgemm"  # DG_JIT_CACHE_DIR
    TILELANG = "tilelang"  # TILELANG_CACHE_DIR
    CUTE_DSL = "cute-dsl"  # CUTE_DSL_CACHE_DIR
    TRTLLM_DEEPGEMM = "trtllm-deepgemm"  # TRTLLM_DG_CACHE_DIR (FlashInfer's FP8 block GEMMs)


def kind_dir(root: Path, kind: CacheKind) -> Path:
    return root / kind.value
