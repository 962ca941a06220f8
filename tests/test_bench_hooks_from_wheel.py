"""bench/vllm_hooks_from_wheel.py: an adapter's hooks looked up in a wheel's source."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from kernelbake.runtime.engines.vllm.compat_layer import Hook
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
from vllm_hooks_from_wheel import check

FILES = {
    "pkg/__init__.py": "from .impl import *\nMODULE_ATTRS = {'Lazy': '.impl:LazyThing'}\ndef __getattr__(n): ...\n",
    "pkg/impl.py": (
        "import functools\n"
        "class Base:\n    def run(self, a, *, b=1, **kw): ...\n"
        "class Engine(Base):\n    @classmethod\n    def make(cls, args, ctx=None): ...\n"
        "    MODE = 3\n"
        "class LazyThing: ...\n"
        "registry = Engine()\n"
        "def moved_here(x): ...\n"
    ),
    "pkg/envs.py": "environment_variables = {'PKG_FLAG': lambda: 1}\ndef __getattr__(n): ...\n",
    "pkg/reexport.py": "from pkg.impl import moved_here as helper\n",
}


def _wheel(tmp_path: Path) -> Path:
    path = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in FILES.items():
            z.writestr(name, text)
    return path


def test_hooks_resolve_through_reexports_bases_instances_and_getattr_tables(tmp_path: Path) -> None:
    doc = check(
        _wheel(tmp_path),
        (
            Hook("pkg:Engine.run", ("self", "a", "b", "kw")),  # from a base class, via `import *`
            Hook("pkg.impl:Engine.make", ("args", "ctx")),  # a classmethod drops cls
            Hook("pkg.impl:Engine.MODE"),
            Hook("pkg.impl:registry.make", ("args", "ctx")),  # an instance's class
            Hook("pkg:Lazy"),  # module __getattr__ table
            Hook("pkg.envs:PKG_FLAG"),
            Hook("pkg.reexport:helper", ("x",)),
        ),
    )
    assert doc["problems"] == []
    assert doc["checked"][0]["found"] == "pkg/impl.py:3"


def test_a_moved_hook_and_a_changed_signature_are_named(tmp_path: Path) -> None:
    doc = check(
        _wheel(tmp_path),
        (
            Hook("pkg.impl:moved_here", ("x", "y")),
            Hook("pkg.impl:gone", ()),
            Hook("pkg.old_place:thing"),
            Hook("pkg.envs:PKG_OTHER"),
        ),
    )
    assert doc["problems"] == [
        "pkg.impl:moved_here: parameters ('x',), the adapter expects ('x', 'y')",
        "pkg.impl:gone: missing (pkg/impl.py: no gone)",
        "pkg.old_place:thing: missing (no module pkg.old_place in the wheel)",
        "pkg.envs:PKG_OTHER: missing (pkg/envs.py: no PKG_OTHER (not in its __getattr__ tables))",
    ]
