"""Pod specs that would move what ``kernelbake serve`` trusts (issue 32, item 4; issue 41, item 3).

``serve`` takes target.json and the pinned manifest (``layout.TRUSTED_FILES``) as the signed
image's own: they decide which caches start warm. A container of a governed image that mounts
a volume (or a device) at one of them or at any directory above (``/opt/kernelbake``, ``/opt``,
``/``), or sets a variable that moves them (``layout.TRUSTED_VARIABLES``), would put other bytes
there than the image's signature covers; such a pod is denied (warned about in warn mode), in
every container kind. The same holds for the cache delta serve merges (``DELTA_ROOT``): only a
governed image volume may be mounted there, whole (no ``subPath``), and nothing inside it; that
the volume verified as a delta for this image is ``rules.delta``'s to judge.

Found while planning (``find``), before any registry is asked: a container of a governed image
whose mounts or variables cannot be read whole makes the object malformed (``MalformedObject``,
code 400); ``check`` reports what was found.

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

from collections.abc import Iterable, Mapping
from typing import Any

from kernelbake.admission.pod import Container, ImageVolume, normal
from kernelbake.admission.rules.facts import Facts, Rule
from kernelbake.admission.rules.shape import Denial, Verdict, verdict
from kernelbake.admission.workloads import MalformedObject
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
if not all(v.startswith(NAMESPACE) for v in _VARIABLES):
    # _env_problems looks only at names in the namespace.
    raise ImportError(f"trusted_paths: a trusted variable outside {NAMESPACE}*: {sorted(_VARIABLES)}")
# Problems listed per pod, and characters shown of a value the pod spec chose: the message
# stays a few KiB however large the spec.
_MAX_LISTED = 8
_MAX_SHOWN = 80
_MOUNT_FIELDS = (("volumeMounts", "mountPath"), ("volumeDevices", "devicePath"))
_INSIDE_DELTA = DELTA_ROOT + "/"


def _shown(value: str) -> str:
    return repr(value if len(value) <= _MAX_SHOWN else value[:_MAX_SHOWN] + "…")


def _items(container: Container, field: str) -> list[Any]:
    """``container``'s ``field``: a list of objects, or absent ([]); else the object is malformed."""
    items = container.obj.get(field)
    if items is None:
        return []
    if not isinstance(items, list):
        raise MalformedObject(f"{container.field}[{container.index}].{field} must be a list of objects")
    for i in items:
        if not isinstance(i, dict):
            raise MalformedObject(f"{container.field}[{container.index}].{field} must be a list of objects")
    return items


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key, "")
    if not isinstance(value, str):
        raise MalformedObject(f"{where}.{key} must be a string")
    return value


def _mount_problems(c: Container, volumes: frozenset[str], found: list[Denial]) -> None:
    for field, key in _MOUNT_FIELDS:
        if c.obj.get(field) is None:
            # Absent (most containers have no volumeDevices): nothing to read or judge.
            continue
        for i, m in enumerate(_items(c, field)):
            written, name = m.get(key, ""), m.get("name", "")
            if not (isinstance(written, str) and isinstance(name, str)):
                at = f"{c.field}[{c.index}].{field}[{i}]"
                _string(m, key, at)
                _string(m, "name", at)
            path = normal(written)
            if not (path in _COVERING or path == DELTA_ROOT or path.startswith(_INSIDE_DELTA)):
                # The usual mount: nothing to say, so nothing of it is formatted.
                continue
            said = f"{field}[{i}] ({_shown(name)}) at {_shown(written)}"
            if covered := _COVERING.get(path):
                found.append(
                    Denial(
                        c.where,
                        f"{said} covers {' and '.join(covered)}, which kernelbake serve trusts as the signed "
                        "image's own",
                        f"mount nothing at or above them (a cache volume belongs at {CACHE_ROOT})",
                    )
                )
            elif path.startswith(_INSIDE_DELTA):
                found.append(
                    Denial(
                        c.where,
                        f"{said} lies inside {DELTA_ROOT}, where kernelbake serve reads the cache delta it merges",
                        "mount nothing there but the delta's own image volume, whole",
                    )
                )
            elif path == DELTA_ROOT and (field != "volumeMounts" or m.get("name") not in volumes):
                found.append(
                    Denial(
                        c.where,
                        f"{said}: only the image volume of a signed cache delta may be mounted at {DELTA_ROOT}, "
                        "where kernelbake serve reads the delta it merges",
                    )
                )
            elif path == DELTA_ROOT and (m.get("subPath") or m.get("subPathExpr")):
                found.append(
                    Denial(
                        c.where,
                        f"{said} mounts part of the volume (subPath)",
                        f"mount the cache delta at {DELTA_ROOT} whole",
                    )
                )


def _env_problems(c: Container, found: list[Denial]) -> None:
    counts: dict[str, int] = {}
    for i, e in enumerate(_items(c, "env")):
        name = e.get("name", "")
        if not isinstance(name, str):
            _string(e, "name", f"{c.field}[{c.index}].env[{i}]")
        if not name.startswith(NAMESPACE):
            # Every variable that moves what serve trusts is in the namespace (_VARIABLES too).
            continue
        if name in _VARIABLES:
            found.append(
                Denial(
                    c.where,
                    f"env sets {name}, which moves the files kernelbake serve trusts as the signed image's own",
                    "remove it (only runs outside an image set it)",
                )
            )
        elif "valueFrom" in e:
            found.append(
                Denial(
                    c.where,
                    f"env[{i}] takes {_shown(name)} from valueFrom, which admission cannot read, and "
                    "kernelbake serve trusts its value",
                    "give the value itself",
                )
            )
        counts[name] = counts.get(name, 0) + 1
    for name, count in counts.items():
        if count > 1:
            found.append(
                Denial(
                    c.where,
                    f"env lists {_shown(name)} {count} times; Kubernetes gives the container the last, so a "
                    "review of one entry may judge a value serve never sees",
                    "list it once",
                )
            )


def _from_problems(c: Container, found: list[Denial]) -> None:
    for i, e in enumerate(_items(c, "envFrom")):
        prefix = _string(e, "prefix", f"{c.field}[{c.index}].envFrom[{i}]")
        if NAMESPACE.startswith(prefix) or prefix.startswith(NAMESPACE):
            source = next((k for k in ("configMapRef", "secretRef") if k in e), "a source")
            found.append(
                Denial(
                    c.where,
                    f"envFrom[{i}] ({source}, prefix {_shown(prefix)}) cannot be inspected here and could set "
                    f"{NAMESPACE}* variables, which kernelbake serve trusts (such as {DELTA_DIGEST_ENV}, which "
                    "pins the cache delta it merges)",
                    f"give it a prefix that does not start {NAMESPACE}, or list its variables under env",
                )
            )


def find(sites: Iterable[object]) -> Verdict:
    """Why the containers among ``sites`` (governed image sites; image volumes are skipped)
    could change what ``serve`` trusts, at most ``_MAX_LISTED`` of them and a count. Raises
    ``MalformedObject`` for a container whose mounts or variables cannot be read whole."""
    listed = list(sites)
    # Governed image volumes: the only volumes that may be mounted at DELTA_ROOT (each is
    # verified, and judged by rules.delta when it is a delta).
    names = []
    for s in listed:
        if isinstance(s, ImageVolume):
            names.append(s.name)
    volumes = frozenset(names)
    found: list[Denial] = []
    more = 0
    for site in listed:
        if not isinstance(site, Container):
            continue
        # Each container's problems in order (mounts, variables, envFrom), appended to the
        # list; what is past _MAX_LISTED is counted and dropped after each container, so the
        # list stays short however many containers have some.
        _mount_problems(site, volumes, found)
        # An absent env or envFrom has nothing to read or judge (_items would answer []).
        if site.obj.get("env") is not None:
            _env_problems(site, found)
        if site.obj.get("envFrom") is not None:
            _from_problems(site, found)
        if len(found) > _MAX_LISTED:
            more += len(found) - _MAX_LISTED
            del found[_MAX_LISTED:]
    if more:
        found.append(
            Denial("", f"{more} more mounts or variables of the pod would move what kernelbake serve trusts")
        )
    return verdict(found)


def check(facts: Facts) -> Verdict:
    return facts.planned.trusted_paths


RULE = Rule(
    "trusted-paths",
    "a container of a governed image that mounts anything at or above the files `serve` trusts as the "
    "signed image's own, or anything but a governed image volume, whole, at or inside the delta root; sets "
    "a variable that moves those files; or sets a `KERNELBAKE_*` variable twice, from `valueFrom`, or "
    "through an `envFrom` whose prefix could",
    check,
)
