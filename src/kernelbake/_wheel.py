"""A wheel of the running kernelbake, to install into images with ``pip --no-deps``.

Built from the imported package itself (works from a source tree, an editable install or an
installed wheel), byte-for-byte reproducible (fixed timestamps, sorted entries), so an
unchanged kernelbake keeps Docker's layer cache warm.

Its metadata is never written by hand: requirements, the Python floor and every entry point
group (the console script, and ``vllm.general_plugins``, which is how vLLM's worker processes
at TP > 1 load the compile-only plugin) come from ``pyproject.toml`` in a source tree, or from
the installed distribution's own metadata (which the build backend made from that file).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.metadata
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path

import kernelbake
from kernelbake.errors import EnvironmentProblem

_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclasses.dataclass(frozen=True)
class Metadata:
    """What the wheel declares, from the project's own description of itself."""

    requires_python: str
    requires: tuple[str, ...]
    # group -> ((name, "module:attr"), …), groups and names sorted for reproducibility.
    entry_points: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]

    def entry_points_txt(self) -> str:
        return "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in items) + "\n"
            for group, items in self.entry_points
        )


def _sorted_groups(
    groups: Mapping[str, Mapping[str, str]],
) -> tuple[tuple[str, tuple[tuple[str, str], ...]], ...]:
    return tuple((g, tuple(sorted(items.items()))) for g, items in sorted(groups.items()) if items)


def metadata_from_pyproject(path: Path) -> Metadata:
    project = tomllib.loads(path.read_text(encoding="utf-8"))["project"]
    groups: dict[str, Mapping[str, str]] = {"console_scripts": project.get("scripts", {})}
    groups.update(project.get("entry-points", {}))
    return Metadata(
        requires_python=project.get("requires-python", ""),
        requires=tuple(project.get("dependencies", ())),
        entry_points=_sorted_groups(groups),
    )


def metadata_from_installed() -> Metadata:
    dist = importlib.metadata.distribution("kernelbake")
    groups: dict[str, dict[str, str]] = {}
    for ep in dist.entry_points:
        groups.setdefault(ep.group, {})[ep.name] = ep.value
    # Extras (``kernelbake[host]``) are host-side: the image installs the core only.
    requires = tuple(r for r in dist.requires or () if "extra ==" not in r)
    return Metadata(
        requires_python=dist.metadata["Requires-Python"] or "",
        requires=requires,
        entry_points=_sorted_groups(groups),
    )


def project_metadata() -> Metadata:
    """``pyproject.toml`` beside ``src/`` when running from a source tree (an editable install's
    recorded metadata may be older than the file), else the installed distribution's."""
    pyproject = package_dir().parents[1] / "pyproject.toml"
    if pyproject.is_file():
        return metadata_from_pyproject(pyproject)
    try:
        return metadata_from_installed()
    except importlib.metadata.PackageNotFoundError:
        raise EnvironmentProblem(
            f"kernelbake at {package_dir()} has neither a pyproject.toml nor installed metadata; "
            "cannot build the in-image wheel",
            hint="install kernelbake (pip install .) or run from its source tree",
        ) from None


def package_dir() -> Path:
    return Path(kernelbake.__file__).resolve().parent


def templates_dir() -> Path:
    """``kernelbake/_templates`` in a wheel; ``templates/`` at the root of a source tree."""
    bundled = resources.files("kernelbake").joinpath("_templates")
    if bundled.is_dir():
        return Path(str(bundled))
    return package_dir().parents[1] / "templates"


def wheel_name() -> str:
    return f"kernelbake-{kernelbake.__version__}-py3-none-any.whl"


def _files() -> Iterator[tuple[str, bytes]]:
    pkg = package_dir()
    for p in sorted(pkg.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".pyo"):
            yield f"kernelbake/{p.relative_to(pkg).as_posix()}", p.read_bytes()
    if not (pkg / "_templates").is_dir():
        tdir = templates_dir()
        for p in sorted(tdir.rglob("*")):
            if p.is_file():
                yield f"kernelbake/_templates/{p.relative_to(tdir).as_posix()}", p.read_bytes()


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build_wheel(out_dir: Path) -> Path:
    version = kernelbake.__version__
    dist_info = f"kernelbake-{version}.dist-info"
    meta = project_metadata()
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: kernelbake",
            f"Version: {version}",
            *([f"Requires-Python: {meta.requires_python}"] if meta.requires_python else []),
            *(f"Requires-Dist: {r}" for r in meta.requires),
            "",
        ]
    )
    wheel = "Wheel-Version: 1.0\nGenerator: kernelbake\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = [
        *_files(),
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", wheel.encode()),
        (f"{dist_info}/entry_points.txt", meta.entry_points_txt().encode()),
    ]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in entries)
    record += f"{dist_info}/RECORD,,\n"
    entries.append((f"{dist_info}/RECORD", record.encode()))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / wheel_name()
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path
