"""``after_import(name, then)``: ``then(module)`` once a module is imported, wherever that
happens next, without importing it here.

kernelbake's vLLM plugin runs in vLLM's API server before most of vLLM is imported, and vLLM's
other processes inherit its state (forked) or run the plugin again (spawned). Importing a module
just to patch it would put its import on every start's path (vLLM's scheduler: 0.6 s on the CPU
image); a finder at the front of ``sys.meta_path`` waits for it instead, then steps aside.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` once ``name`` has been imported, wherever that happens next (a
    forked engine core inherits the finder; a spawned one registers it again)."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, then = spec.loader, self.then

        class Loader(importlib.abc.Loader):
            def __getattr__(self, name: str) -> Any:
                # get_source, get_code…: tracebacks and inspect ask the original.
                return getattr(loader, name)

            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                try:
                    then(module)
                except Exception as exc:  # the module stays imported: vLLM must not fail for it
                    print(
                        f"kernelbake: WARNING: after importing {fullname}: {type(exc).__name__}: {exc}",
                        file=sys.stderr,
                    )

        spec.loader = Loader()
        return spec


def after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """``then(module)`` now if ``name`` is imported, else right after it is."""
    if (module := sys.modules.get(name)) is not None:
        then(module)
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))
