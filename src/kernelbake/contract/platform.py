"""The platform an image builds or runs on: what a probe measures, as the key names it."""

from __future__ import annotations

import dataclasses

# Architecture-specific ("a") targets are what Hopper and Blackwell kernels are built for
# (wgmma, TMA); their cubins run on no other capability, so every chip of these
# capabilities gets the suffix.
_ARCH_SPECIFIC = {(9, 0), (10, 0), (10, 3), (12, 0), (12, 1)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Software:
    """The versions that key compiled code: what an engine release ships (the catalogue, so the
    planned key) and what a probe finds in an image. Each field is the key field of that name."""

    engine_version: str
    torch: str
    triton: str
    cuda: str
    flashinfer: str
    python: str


_SOFTWARE = tuple(f.name for f in dataclasses.fields(Software))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Platform:
    """What a probe measured where an image builds or runs; ``none`` where not applicable."""

    software: Software
    arch: str
    device: str
    # The installed driver, as the container sees it. The key's ``driver_floor`` is the lowest
    # driver the image needs; ``compat.check`` compares the two.
    driver: str

    @staticmethod
    def field_names() -> tuple[str, ...]:
        """The measured fields, flat and in the key's order (``driver`` where the key has its floor)."""
        return (*_SOFTWARE, "arch", "device", "driver")

    def fields(self) -> dict[str, str]:
        """Field name → value, as ``field_names`` orders them (``kernelbake check --json``'s ``found``)."""
        return {
            name: getattr(self.software, name) if name in _SOFTWARE else getattr(self, name)
            for name in self.field_names()
        }


def arch_for(capability: tuple[int, int]) -> str:
    """The key's ``arch`` for a CUDA compute capability: ``sm_90a`` for (9, 0), ``sm_86`` for
    (8, 6). The plan takes it from the catalogue and a probe computes it from the device, so
    the catalogue is tested to agree with this rule."""
    major, minor = capability
    suffix = "a" if (major, minor) in _ARCH_SPECIFIC else ""
    return f"sm_{major}{minor}{suffix}"
