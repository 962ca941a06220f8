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

from collections.abc import Iterable, Iterator, Mapping
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
# Problems listed per pod, and characters shown of a value the pod spec chose: the message
# stays a few KiB however large the spec.
_MAX_LISTED = 8
_MAX_SHOWN = 80


def _shown(value: str) -> str:
    return repr(value if len(value) <= _MAX_SHOWN else value[:_MAX_SHOWN] + "…")


def _items(container: Container, field: str) -> list[Any]:
    items = container.obj.get(field)
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise MalformedObject(f"{container.field}[{container.index}].{field} must be a list of objects")
    return items


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key, "")
    if not isinstance(value, str):
        raise MalformedObject(f"{where}.{key} must be a string")
    return value


def _mount_problems(c: Container, volumes: frozenset[str]) -> Iterator[Denial]:
    for field, key in (("volumeMounts", "mountPath"), ("volumeDevices", "devicePath")):
        for i, m in enumerate(_items(c, field)):
            written, name = m.get(key, ""), m.get("name", "")
            if not (isinstance(written, str) and isinstance(name, str)):
                at = f"{c.field}[{c.index}].{field}[{i}]"
                _string(m, key, at)
                _string(m, "name", at)
            path = normal(written)
            if not (path in _COVERING or path == DELTA_ROOT or path.startswith(DELTA_ROOT + "/")):
                # The usual mount: nothing to say, so nothing of it is formatted.
                continue
            said = f"{field}[{i}] ({_shown(name)}) at {_shown(written)}"
            if covered := _COVERING.get(path):
                yield Denial(
                    c.where,
                    f"{said} covers {' and '.join(covered)}, which kernelbake serve trusts as the signed "
                    "image's own",
                    f"mount nothing at or above them (a cache volume belongs at {CACHE_ROOT})",
                )
            elif path.startswith(DELTA_ROOT + "/"):
                yield Denial(
                    c.where,
                    f"{said} lies inside {DELTA_ROOT}, where kernelbake serve reads the cache delta it merges",
                    "mount nothing there but the delta's own image volume, whole",
                )
            elif path == DELTA_ROOT and (field != "volumeMounts" or m.get("name") not in volumes):
                yield Denial(
                    c.where,
                    f"{said}: only the image volume of a signed cache delta may be mounted at {DELTA_ROOT}, "
                    "where kernelbake serve reads the delta it merges",
                )
            elif path == DELTA_ROOT and (m.get("subPath") or m.get("subPathExpr")):
                yield Denial(
                    c.where,
                    f"{said} mounts part of the volume (subPath)",
                    f"mount the cache delta at {DELTA_ROOT} whole",
                )


def _env_problems(c: Container) -> Iterator[Denial]:
    counts: dict[str, int] = {}
    for i, e in enumerate(_items(c, "env")):
        name = e.get("name", "")
        if not isinstance(name, str):
            _string(e, "name", f"{c.field}[{c.index}].env[{i}]")
        if name in _VARIABLES:
            yield Denial(
                c.where,
                f"env sets {name}, which moves the files kernelbake serve trusts as the signed image's own",
                "remove it (only runs outside an image set it)",
            )
        elif name.startswith(NAMESPACE) and "valueFrom" in e:
            yield Denial(
                c.where,
                f"env[{i}] takes {_shown(name)} from valueFrom, which admission cannot read, and "
                "kernelbake serve trusts its value",
                "give the value itself",
            )
        if name.startswith(NAMESPACE):
            counts[name] = counts.get(name, 0) + 1
    for name, count in counts.items():
        if count > 1:
            yield Denial(
                c.where,
                f"env lists {_shown(name)} {count} times; Kubernetes gives the container the last, so a "
                "review of one entry may judge a value serve never sees",
                "list it once",
            )


def _from_problems(c: Container) -> Iterator[Denial]:
    for i, e in enumerate(_items(c, "envFrom")):
        prefix = _string(e, "prefix", f"{c.field}[{c.index}].envFrom[{i}]")
        if NAMESPACE.startswith(prefix) or prefix.startswith(NAMESPACE):
            source = next((k for k in ("configMapRef", "secretRef") if k in e), "a source")
            yield Denial(
                c.where,
                f"envFrom[{i}] ({source}, prefix {_shown(prefix)}) cannot be inspected here and could set "
                f"{NAMESPACE}* variables, which kernelbake serve trusts (such as {DELTA_DIGEST_ENV}, which pins "
                "the cache delta it merges)",
                f"give it a prefix that does not start {NAMESPACE}, or list its variables under env",
            )


def find(sites: Iterable[object]) -> Verdict:
    """Why the containers among ``sites`` (governed image sites; image volumes are skipped)
    could change what ``serve`` trusts, at most ``_MAX_LISTED`` of them and a count. Raises
    ``MalformedObject`` for a container whose mounts or variables cannot be read whole."""
    listed = list(sites)
    # Governed image volumes: the only volumes that may be mounted at DELTA_ROOT (each is
    # verified, and judged by rules.delta when it is a delta).
    volumes = frozenset(s.name for s in listed if isinstance(s, ImageVolume))
    found: list[Denial] = []
    more = 0
    for site in listed:
        if not isinstance(site, Container):
            continue
        for problems in (_mount_problems(site, volumes), _env_problems(site), _from_problems(site)):
            for problem in problems:
                if len(found) < _MAX_LISTED:
                    found.append(problem)
                else:
                    more += 1
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
