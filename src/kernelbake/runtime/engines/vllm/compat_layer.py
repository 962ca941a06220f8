"""Which version-specific module implements compile-only for the installed vLLM."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from kernelbake.errors import KeyMismatch
from kernelbake.runtime.probe import dist_version

# vLLM minor version → module with ``install(report)``. A release kernelbake has not been
# validated against fails the build rather than baking caches that might never be hit.
_PATCHES = {"0.26": "kernelbake.runtime.engines.vllm._v0_26"}


def native_compile_available() -> bool:
    """True when vLLM ships its own compile-only entry point (``vllm compile``), which
    kernelbake then prefers to its own patches. No release up to 0.33 has one."""
    try:
        return importlib.util.find_spec("vllm.entrypoints.cli.compile") is not None
    except ModuleNotFoundError:  # no vLLM at all
        return False


def patches_for_installed_vllm() -> ModuleType:
    version = dist_version("vllm")
    minor = ".".join(version.split(".")[:2])
    try:
        return importlib.import_module(_PATCHES[minor])
    except KeyError:
        raise KeyMismatch(
            f"vLLM {version}: kernelbake's compile-only supports vLLM {', '.join(sorted(_PATCHES))}",
            hint="pin a supported engine version in the spec",
        ) from None
