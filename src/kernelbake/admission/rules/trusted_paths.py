"""Pod specs that would move what ``kernelbake serve`` trusts (issue 32, item 4; issue 41, item 3).

``serve`` takes target.json and the pinned manifest (``layout.TRUSTED_FILES``) as the signed
image's own: they decide which caches start warm. A container of a governed image that mounts
a volume (or a device) at one of them or at any directory above (``/opt/kernelbake``, ``/opt``,
``/``), or sets a variable that moves them (``layout.TRUSTED_VARIABLES``), would put other bytes
there than the image's signature covers; such a pod is denied (warned about in warn mode), in
every container kind. The same holds for the cache delta serve merges (``DELTA_ROOT``): only a
governed image volume may be mounted there, whole (no ``subPath``), and nothing inside it; that
the volume verified as a delta for this image is ``admission.deltas``' to judge.

Variables: Kubernetes gives a container the *last* entry of a name listed twice in ``env`` (and
``env`` over ``envFrom``), so a review that read one entry could judge a value the container
never sees. Every ``KERNELBAKE_*`` name (the runtime's namespace: every variable of its table
that changes what it trusts is one) is therefore allowed once per container, with a literal
value: a duplicate, a ``valueFrom`` (a ConfigMap or Secret admission cannot read) or an
``envFrom`` whose prefix could produce such a name is denied (fail closed).

Where this ends: paths are compared as written, normalised (``//``, ``..``, trailing ``/``); a
symlink in the image that leads a mount elsewhere is not known here, and ``serve`` itself
refuses to start warm on any mount that covers a trusted file (``runtime.trusted``) and to use a
delta with a mount inside ``DELTA_ROOT`` (``runtime.delta``).

Linear in the pod spec: each container, mount and variable is looked at once, against sets.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

from kernelbake.admission.volumes import ImageVolume
from kernelbake.admission.workloads import Container, MalformedObject
from kernelbake.contract.delta import DELTA_DIGEST_ENV, DELTA_ROOT
from kernelbake.contract.layout import CACHE_ROOT, TRUSTED_FILES, TRUSTED_VARIABLES

# Every path a mount must not be at: the trusted files and each directory above them.
_COVERING = {
    p: tuple(f for f in TRUSTED_FILES if p == "/" or f == p or f.startswith(p + "/"))
    for f in TRUSTED_FILES
    for p in [f, *(f[:i] or "/" for i, c in enumerate(f) if c == "/")]
}
_VARIABLES = frozenset(TRUSTED_VARIABLES)
# The runtime's namespace: the variables that move, pin or weaken what serve trusts
# (``TRUSTED_VARIABLES``, ``$KERNELBAKE_DELTA_DIGEST``, ``$KERNELBAKE_VERIFY``…) all start so;
# tests/admission/test_trusted_paths.py checks it against the runtime's own table.
NAMESPACE = "KERNELBAKE_"
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


def _mount_problems(
    c: Container, obj: Mapping[str, Any], where: str, volumes: frozenset[str]
) -> Iterable[str]:
    for field, key in (("volumeMounts", "mountPath"), ("volumeDevices", "devicePath")):
        for i, m in enumerate(_items(obj, field, where)):
            written = _string(m, key, f"{where}.{field}[{i}]")
            path = normal(written)
            name = _string(m, "name", f"{where}.{field}[{i}]")
            said = f"{c.where}: {field}[{i}] ({_shown(name)}) at {_shown(written)}"
            if covered := _COVERING.get(path):
                yield (
                    f"{said} covers {' and '.join(covered)}, which kernelbake serve trusts as the signed "
                    f"image's own; mount nothing at or above them (a cache volume belongs at {CACHE_ROOT})"
                )
            elif path.startswith(DELTA_ROOT + "/"):
                yield (
                    f"{said} lies inside {DELTA_ROOT}, where kernelbake serve reads the cache delta it "
                    "merges; mount nothing there but the delta's own image volume, whole"
                )
            elif path == DELTA_ROOT and (field != "volumeMounts" or m.get("name") not in volumes):
                yield (
                    f"{said}: only the image volume of a signed cache delta may be mounted at {DELTA_ROOT}, "
                    "where kernelbake serve reads the delta it merges"
                )
            elif path == DELTA_ROOT and (m.get("subPath") or m.get("subPathExpr")):
                yield (
                    f"{said} mounts part of the volume (subPath); mount the cache delta at {DELTA_ROOT} whole"
                )


def _env_problems(c: Container, obj: Mapping[str, Any], where: str) -> Iterable[str]:
    counts: dict[str, int] = {}
    for i, e in enumerate(_items(obj, "env", where)):
        name = _string(e, "name", f"{where}.env[{i}]")
        if name in _VARIABLES:
            yield (
                f"{c.where}: env sets {name}, which moves the files kernelbake serve trusts as the signed "
                "image's own; remove it (only runs outside an image set it)"
            )
        elif name.startswith(NAMESPACE) and "valueFrom" in e:
            yield (
                f"{c.where}: env[{i}] takes {_shown(name)} from valueFrom, which admission cannot read, and "
                "kernelbake serve trusts its value; give the value itself"
            )
        if name.startswith(NAMESPACE):
            counts[name] = counts.get(name, 0) + 1
    for name, count in counts.items():
        if count > 1:
            yield (
                f"{c.where}: env lists {_shown(name)} {count} times; Kubernetes gives the container the last, "
                "so a review of one entry may judge a value serve never sees; list it once"
            )


def _from_problems(c: Container, obj: Mapping[str, Any], where: str) -> Iterable[str]:
    for i, e in enumerate(_items(obj, "envFrom", where)):
        prefix = _string(e, "prefix", f"{where}.envFrom[{i}]")
        if NAMESPACE.startswith(prefix) or prefix.startswith(NAMESPACE):
            source = next((k for k in ("configMapRef", "secretRef") if k in e), "a source")
            yield (
                f"{c.where}: envFrom[{i}] ({source}, prefix {_shown(prefix)}) cannot be inspected here and "
                f"could set {NAMESPACE}* variables, which kernelbake serve trusts (such as {DELTA_DIGEST_ENV}, "
                f"which pins the cache delta it merges); give it a prefix that does not start {NAMESPACE}, or "
                "list its variables under env"
            )


def _container_problems(c: Container, spec: Mapping[str, Any], volumes: frozenset[str]) -> Iterable[str]:
    obj = spec[c.field][c.index]
    where = f"{c.field}[{c.index}]"
    yield from _mount_problems(c, obj, where, volumes)
    yield from _env_problems(c, obj, where)
    yield from _from_problems(c, obj, where)


def problems(spec: Mapping[str, Any], governed: Iterable[object]) -> list[str]:
    """Why the pod's containers among ``governed`` (image sites; image volumes are skipped)
    could change what ``serve`` trusts, at most ``_MAX_LISTED`` of them and a count."""
    sites = list(governed)
    # Governed image volumes: the only volumes that may be mounted at DELTA_ROOT (each is
    # verified, and judged by admission.deltas when it is a delta).
    volumes = frozenset(s.name for s in sites if isinstance(s, ImageVolume))
    found: list[str] = []
    more = 0
    for site in sites:
        if not isinstance(site, Container):
            continue
        for problem in _container_problems(site, spec, volumes):
            if len(found) < _MAX_LISTED:
                found.append(problem)
            else:
                more += 1
    if more:
        found.append(f"{more} more mounts or variables of the pod would move what kernelbake serve trusts")
    return found
