"""A wheel of the running kernelbake, to install into images with ``pip --no-deps``.

Built from the imported package itself (works from a source tree, an editable install or an
installed wheel), byte-for-byte reproducible (fixed timestamps, sorted entries), so an
unchanged kernelbake keeps Docker's layer cache warm.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import kernelbake

_EPOCH = (1980, 1, 1, 0, 0, 0)
_REQUIRES = ("PyYAML>=6.0", "Jinja2>=3.1")


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
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            "Name: kernelbake",
            f"Version: {version}",
            "Requires-Python: >=3.11",
            *(f"Requires-Dist: {r}" for r in _REQUIRES),
            "",
        ]
    )
    wheel = "Wheel-Version: 1.0\nGenerator: kernelbake\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    entries = [
        *_files(),
        (f"{dist_info}/METADATA", metadata.encode()),
        (f"{dist_info}/WHEEL", wheel.encode()),
        (f"{dist_info}/entry_points.txt", b"[console_scripts]\nkernelbake = kernelbake.cli:main\n"),
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
