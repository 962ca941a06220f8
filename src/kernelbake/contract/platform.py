"""The platform an image builds or runs on, as the key names it."""

from __future__ import annotations

# Architecture-specific ("a") targets are what Hopper and Blackwell kernels are built for
# (wgmma, TMA); their cubins run on no other capability, so every chip of these
# capabilities gets the suffix.
_ARCH_SPECIFIC = {(9, 0), (10, 0), (10, 3), (12, 0), (12, 1)}


def arch_for(capability: tuple[int, int]) -> str:
    """The key's ``arch`` for a CUDA compute capability: ``sm_90a`` for (9, 0), ``sm_86`` for
    (8, 6). The plan takes it from the catalogue and a probe computes it from the device, so
    the catalogue is tested to agree with this rule."""
    major, minor = capability
    suffix = "a" if (major, minor) in _ARCH_SPECIFIC else ""
    return f"sm_{major}{minor}{suffix}"
