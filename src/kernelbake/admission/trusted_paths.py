"""Pod specs that would move what ``kernelbake serve`` trusts (issue 32, item 4).

``serve`` takes target.json and the pinned manifest (``layout.TRUSTED_FILES``) as the signed
image's own: they decide which caches start warm. A container of a governed image that mounts
a volume (or a device) at one of them or at any directory above (``/opt/kernelbake``, ``/opt``,
``/``), or sets a variable that moves them (``layout.TRUSTED_VARIABLES``), would put other bytes
there than the image's signature covers; such a pod is denied (warned about in warn mode), in
every container kind. ``envFrom`` cannot be read here: one whose prefix could produce a named
variable is denied too (fail closed). A volume at the cache root, the documented recipe, moves
neither file and is left to ``cache_volumes``.

Where this ends: paths are compared as written, normalised (``//``, ``..``, trailing ``/``); a
symlink in the image that leads a mount elsewhere is not known here, and ``serve`` itself
refuses to start warm on any mount that covers a trusted file (``runtime.trusted``).

Linear in the pod spec: each container, mount and variable is looked at once, against sets.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

from kernelbake.admission.workloads import Container, MalformedObject
from kernelbake.contract.delta import DELTA_DIGEST_ENV
from kernelbake.contract.layout import CACHE_ROOT, TRUSTED_FILES, TRUSTED_VARIABLES

# Every path a mount must not be at: the trusted files and each directory above them.
_COVERING = {
    p: tuple(f for f in TRUSTED_FILES if p == "/" or f == p or f.startswith(p + "/"))
    for f in TRUSTED_FILES
    for p in [f, *(f[:i] or "/" for i, c in enumerate(f) if c == "/")]
}
_VARIABLES = frozenset(TRUSTED_VARIABLES)
# What an envFrom must not be able to set either: the variable that pins a cache delta, which
# admission.deltas sets (or checks) only for a delta it verified, and cannot check in a source
# it cannot read.
_FROM_SOURCES = _VARIABLES | {DELTA_DIGEST_ENV}
# Problems listed per pod, and characters shown of a value the pod spec chose: the message
# stays a few KiB however large the spec.
_MAX_LISTED = 8
_MAX_SHOWN = 80


def normal(path: str) -> str:
    """``path`` as the container's root resolves it lexically: relative paths under ``/``,
    ``//`` and ``..`` collapsed, no trailing ``/``."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def _shown(value: str) -> str:
    return repr(value if len(value) <= _MAX_SHOWN else value[:_MAX_SHOWN] + "…")


def _items(container: Mapping[str, Any], field: str, where: str) -> list[Any]:
    items = container.get(field)
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise MalformedObject(f"{where}.{field} must be a list of objects")
    return items


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key, "")
    if not isinstance(value, str):
        raise MalformedObject(f"{where}.{key} must be a string")
    return value


def _container_problems(c: Container, spec: Mapping[str, Any]) -> Iterable[str]:
    obj = spec[c.field][c.index]
    where = f"{c.field}[{c.index}]"
    for field, key in (("volumeMounts", "mountPath"), ("volumeDevices", "devicePath")):
        for i, m in enumerate(_items(obj, field, where)):
            path = _string(m, key, f"{where}.{field}[{i}]")
            covered = _COVERING.get(normal(path))
            if covered:
                yield (
                    f"{c.where}: {field}[{i}] ({_shown(_string(m, 'name', where))}) at {_shown(path)} covers "
                    f"{' and '.join(covered)}, which kernelbake serve trusts as the signed image's own; "
                    f"mount nothing at or above them (a cache volume belongs at {CACHE_ROOT})"
                )
    for i, e in enumerate(_items(obj, "env", where)):
        name = _string(e, "name", f"{where}.env[{i}]")
        if name in _VARIABLES:
            yield (
                f"{c.where}: env sets {name}, which moves the files kernelbake serve trusts as the signed "
                "image's own; remove it (only runs outside an image set it)"
            )
    for i, e in enumerate(_items(obj, "envFrom", where)):
        prefix = _string(e, "prefix", f"{where}.envFrom[{i}]")
        could = sorted(v for v in _FROM_SOURCES if v.startswith(prefix))
        if could:
            source = next((k for k in ("configMapRef", "secretRef") if k in e), "a source")
            yield (
                f"{c.where}: envFrom[{i}] ({source}, prefix {prefix!r}) cannot be inspected here and could "
                f"set {', '.join(could)}, which move (or pin) the files kernelbake serve trusts; give it a prefix "
                "that none of them starts with, or list its variables under env"
            )


def problems(spec: Mapping[str, Any], governed: Iterable[object]) -> list[str]:
    """Why the pod's containers among ``governed`` (image sites; image volumes are skipped)
    could change what ``serve`` trusts, at most ``_MAX_LISTED`` of them and a count."""
    found: list[str] = []
    more = 0
    for site in governed:
        if not isinstance(site, Container):
            continue
        for problem in _container_problems(site, spec):
            if len(found) < _MAX_LISTED:
                found.append(problem)
            else:
                more += 1
    if more:
        found.append(f"{more} more mounts or variables of the pod would move what kernelbake serve trusts")
    return found
