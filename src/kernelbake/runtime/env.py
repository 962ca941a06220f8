"""The environment inside an image, read in one place (``RuntimeEnv.from_env``).

The host has ``kernelbake.settings``; code in the image never reads ``os.environ`` elsewhere.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from pathlib import Path

from kernelbake.errors import BadInput
from kernelbake.runtime.config import TARGET_FILE

# Where BuildKit mounts ``--mount=type=secret,id=hf_token`` in the model-fetch step.
HF_TOKEN_SECRET = Path("/run/secrets/hf_token")


class CacheMode(enum.Enum):
    # Use the baked caches when the preflight finds them valid.
    ON = "on"
    # Start cold on purpose (benchmarks, debugging): the baked caches are never touched.
    OFF = "off"


class VerifyMode(enum.Enum):
    # Sizes only: the layers were digest-checked at pull, so this catches what was mounted over.
    SIZE = "size"
    # Hash every file against the manifest.
    DEEP = "deep"


def _enum_value(cls: type[enum.Enum], name: str, raw: str) -> enum.Enum:
    try:
        return cls(raw.lower())
    except ValueError:
        choices = ", ".join(m.value for m in cls)
        raise BadInput(f"${name}={raw!r}: expected one of {choices}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeEnv:
    target_file: Path = Path(TARGET_FILE)
    cache: CacheMode = CacheMode.ON
    verify: VerifyMode = VerifyMode.SIZE
    # A writable directory for cold-start caches and, failing a writable cache root, a copy.
    scratch: Path = Path("/tmp")
    # Free-form identity of the build host (e.g. set by the builder's CDI spec); recorded in
    # the manifest's builder entry.
    builder: str = ""
    hf_token: str | None = None
    # ``kernelbake serve`` writes its JSON status here (preflight, prediction, evidence).
    status_file: Path | None = None
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RuntimeEnv:
        env = dict(os.environ if environ is None else environ)
        token = env.get("HF_TOKEN") or None
        if token is None and HF_TOKEN_SECRET.is_file():
            token = HF_TOKEN_SECRET.read_text().strip() or None
        cache = _enum_value(CacheMode, "KERNELBAKE_CACHE", env.get("KERNELBAKE_CACHE", "on"))
        verify = _enum_value(VerifyMode, "KERNELBAKE_VERIFY", env.get("KERNELBAKE_VERIFY", "size"))
        assert isinstance(cache, CacheMode) and isinstance(verify, VerifyMode)
        return cls(
            target_file=Path(env.get("KERNELBAKE_TARGET", TARGET_FILE)),
            cache=cache,
            verify=verify,
            scratch=Path(env.get("KERNELBAKE_SCRATCH") or env.get("TMPDIR") or "/tmp"),
            builder=env.get("KERNELBAKE_BUILDER", ""),
            hf_token=token,
            status_file=Path(
                env.get("KERNELBAKE_STATUS")
                or Path(env.get("KERNELBAKE_SCRATCH") or env.get("TMPDIR") or "/tmp")
                / "kernelbake-status.json"
            ),
            environ=env,
        )


def apply(variables: Mapping[str, str]) -> None:
    """Set variables in this process before an engine is imported (the compile step runs the
    engine in-process; ``serve`` passes a complete environment to ``exec`` instead)."""
    os.environ.update(variables)
