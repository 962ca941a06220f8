"""The cache manifest the runtime trusts is the one the image was built with.

The manifest in the cache root vouches for every cache file, but it sits where a writable
cache volume, a seeded emptyDir or an image built FROM this one can replace it together
with the files it lists. So ``serve``, ``check`` and ``seed-cache`` first compare its sha256
with one they get from a place a cache mount cannot replace:

- the image's own copy, ``/opt/kernelbake/pinned-manifest.json`` (``layout.PINNED_MANIFEST``):
  the final stage copies the manifest there, outside the cache root, in a layer the image's
  signature covers (as it covers every layer);
- ``$KERNELBAKE_MANIFEST_DIGEST``, for caches that arrive by volume into an image without a
  pinned copy: whoever creates the pod sets it (an admission webhook, once it has verified
  the cache artifact's signature). kernelbake cannot tell who set it; it is exactly as
  trustworthy as the pod spec. Where the image pins a copy, the variable can only add a
  requirement (both must agree), never lift one.

Neither present, or either different: the baked caches are not used (fail closed). Nor are they
when the image's copy (or target.json) is not the image's own where it is read: a mount of the
pod covers it, or its owner or mode is not an image file's (``runtime.trusted``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kernelbake.contract.artifact import MANIFEST_DIGEST_ENV
from kernelbake.contract.layout import MANIFEST
from kernelbake.runtime import trusted
from kernelbake.runtime.env import RuntimeEnv

_RESEED = (
    "the cache root holds another bundle than the one this image was built with; remove the volume "
    "mounted there, or seed it again from this image (python3 -m kernelbake seed-cache)"
)


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return False
    return True


def problems(env: RuntimeEnv, root: Path, data: bytes) -> list[str]:
    """Why the manifest ``data`` read from ``root`` is not the pinned one (empty when it is)."""
    found = digest(data)
    where = root / MANIFEST
    pinned = env.pinned_manifest
    if not env.unsafe_target and (untrusted := trusted.untrusted((str(env.target_file), str(pinned)))):
        return untrusted
    if _inside(pinned, root):
        return [
            f"the pinned manifest {pinned} lies inside the cache root {root}, where a volume can replace "
            "it; keep target.json and the pinned manifest outside the cache root"
        ]
    expected: list[tuple[str, str]] = []
    try:
        expected.append((digest(pinned.read_bytes()), f"this image ({pinned})"))
    except FileNotFoundError:
        pass
    except OSError as exc:
        return [
            f"the pinned manifest {pinned} cannot be read ({exc.strerror}); {where} cannot be tied to the image"
        ]
    if env.manifest_digest:
        expected.append((env.manifest_digest, f"${MANIFEST_DIGEST_ENV}"))
    if not expected:
        return [
            f"nothing pins the cache manifest: {pinned} is missing and ${MANIFEST_DIGEST_ENV} is unset, so "
            f"{where} ({found}) cannot be tied to a signed image; rebuild the image with this kernelbake "
            f"(its final stage pins the manifest), or set ${MANIFEST_DIGEST_ENV} to the digest you verified"
        ]
    return [
        f"{where} is {found}, but {source} pins {want}: {_RESEED}"
        for want, source in expected
        if want != found
    ]
