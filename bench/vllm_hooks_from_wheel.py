"""An adapter's hooks checked against a vLLM wheel's source, without importing it.

Where a release cannot be imported here (vLLM 0.34 needs torch 2.14 and FlashInfer 0.7.3, and
PyPI's CPU build stops at 0.32), its wheel can still be read: each ``Hook`` of the adapter
(``compat_layer.Hook``: ``module:attr.attr`` and the parameters it expects) is looked up in the
wheel's Python source with ``ast``, following ``from … import`` re-exports, base classes, module
``__getattr__`` tables and instances of a class, and its parameters are read the way
``inspect.signature`` reports them (``cls`` dropped from a classmethod). The import-based check
(``compat_layer.hook_problems``, run in the image) stays the one that counts where the release
imports; this says what a wheel's source holds. Prints JSON; exits 1 when any hook is missing or
its parameters differ.

    python3 bench/vllm_hooks_from_wheel.py vllm-0.34.0-*.whl --adapter _v0_34 \
        --out bench/results/vllm-0.34.0-hooks.json
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Statements that hold top-level definitions under a condition (TYPE_CHECKING, try/except).
_BLOCKS = (ast.If, ast.Try)


@dataclass(frozen=True)
class Found:
    """What a path resolved to: a function's parameters, or ``None`` for anything else."""

    params: tuple[str, ...] | None
    where: str


class Source:
    """The ``.py`` files of one wheel, by module name."""

    def __init__(self, wheel: Path) -> None:
        with zipfile.ZipFile(wheel) as z:
            self.files = {n: z.read(n).decode(errors="replace") for n in z.namelist() if n.endswith(".py")}
        self._trees: dict[str, ast.Module] = {}

    def module(self, name: str) -> tuple[ast.Module, str] | None:
        base = name.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if path in self.files:
                if path not in self._trees:
                    self._trees[path] = ast.parse(self.files[path], path)
                return self._trees[path], path
        return None


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, _BLOCKS):
            out += _statements(node.body)
            out += _statements(getattr(node, "orelse", []))
            for handler in getattr(node, "handlers", []):
                out += _statements(handler.body)
    return out


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[str, ...]:
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args)]
    if a.vararg:
        names.append(a.vararg.arg)
    names += [x.arg for x in a.kwonlyargs]
    if a.kwarg:
        names.append(a.kwarg.arg)
    decorators = {d.id for d in fn.decorator_list if isinstance(d, ast.Name)}
    # Reached through its class, as the hooks are: ``inspect.signature`` drops only ``cls``.
    if "classmethod" in decorators:
        names = names[1:]
    return tuple(names)


def _absolute(module: str, level: int, target: str | None, is_package: bool) -> str:
    if not level:
        return target or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, *([target] if target else [])])


class Resolver:
    def __init__(self, source: Source) -> None:
        self.source = source

    def resolve(self, path: str) -> Found | str:
        """The object at ``module:attr.attr``, or a line saying where the lookup stopped."""
        module, _, attrs = path.partition(":")
        if self.source.module(module) is None:
            return f"no module {module} in the wheel"
        if not attrs:
            return Found(None, module)
        return self._in_module(module, attrs.split("."), depth=0)

    def _in_module(self, module: str, attrs: list[str], depth: int) -> Found | str:
        if depth > 12:
            return f"{module}: re-exports too deep"
        found = self.source.module(module)
        if found is None:
            return f"no module {module} in the wheel"
        tree, file = found
        name, rest = attrs[0], attrs[1:]
        is_package = file.endswith("__init__.py")
        for node in reversed(_statements(tree.body)):
            hit = self._statement(module, file, node, name, rest, is_package, depth)
            if hit is not None:
                return hit
        # ``from .parallel_state import *`` (vllm.distributed).
        for node in _statements(tree.body):
            if isinstance(node, ast.ImportFrom) and [a.name for a in node.names] == ["*"]:
                hit = self._in_module(
                    _absolute(module, node.level, node.module, is_package), attrs, depth + 1
                )
                if isinstance(hit, Found):
                    return hit
        # A submodule reached as an attribute of its package.
        if self.source.module(f"{module}.{name}") is not None:
            return (
                self._in_module(f"{module}.{name}", rest, depth + 1)
                if rest
                else Found(None, f"{module}.{name}")
            )
        return self._lazy(module, file, tree, name, rest, depth)

    def _statement(
        self, module: str, file: str, node: ast.stmt, name: str, rest: list[str], is_package: bool, depth: int
    ) -> Found | str | None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return Found(_params(node), f"{file}:{node.lineno}") if not rest else None
        if isinstance(node, ast.ClassDef) and node.name == name:
            return (
                self._in_class(module, node, file, rest, depth)
                if rest
                else Found(None, f"{file}:{node.lineno}")
            )
        if isinstance(node, (ast.ImportFrom, ast.Import)):
            return self._imported(module, node, name, rest, is_package, depth)
        targets = _assigned(node)
        if name in targets:
            if not rest:
                return Found(None, f"{file}:{node.lineno}")
            value = getattr(node, "value", None)
            # An instance: ``ModelRegistry = _ModelRegistry(...)``; its attributes are its class's.
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                return self._in_module(module, [value.func.id, *rest], depth + 1)
            return (
                f"{file}:{node.lineno}: {name} is assigned, its attribute {rest[0]} cannot be read statically"
            )
        return None

    def _imported(
        self,
        module: str,
        node: ast.ImportFrom | ast.Import,
        name: str,
        rest: list[str],
        is_package: bool,
        depth: int,
    ) -> Found | str | None:
        for alias in node.names:
            if isinstance(node, ast.Import):
                if alias.asname == name:
                    return self._in_module(alias.name, rest, depth + 1) if rest else Found(None, alias.name)
                continue
            if (alias.asname or alias.name) != name:
                continue
            origin = _absolute(module, node.level, node.module, is_package)
            sub = f"{origin}.{alias.name}"
            if self.source.module(sub) is not None:
                return self._in_module(sub, rest, depth + 1) if rest else Found(None, sub)
            return self._in_module(origin, [alias.name, *rest], depth + 1)
        return None

    def _in_class(
        self, module: str, cls: ast.ClassDef, file: str, rest: list[str], depth: int
    ) -> Found | str:
        name = rest[0]
        for node in _statements(cls.body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return Found(_params(node), f"{file}:{node.lineno}")
            if name in _assigned(node):
                return Found(None, f"{file}:{node.lineno}")
        for base in cls.bases:
            if isinstance(base, ast.Name):
                hit = self._in_module(module, [base.id, *rest], depth + 1)
                if isinstance(hit, Found):
                    return hit
        return f"{file}:{cls.lineno}: class {cls.name} has no {name}"

    def _lazy(
        self, module: str, file: str, tree: ast.Module, name: str, rest: list[str], depth: int
    ) -> Found | str:
        """A module ``__getattr__`` serving names from a table: ``{"Name": ".mod:Name"}`` (vLLM's
        package) or ``{"VLLM_X": lambda: …}`` (``vllm.envs``)."""
        if not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body):
            return f"{file}: no {name}"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict):
                continue
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == name:
                    if (
                        isinstance(value, ast.Constant)
                        and isinstance(value.value, str)
                        and ":" in value.value
                    ):
                        target, _, attr = value.value.partition(":")
                        level = len(target) - len(target.lstrip("."))
                        origin = _absolute(module, level, target.lstrip(".") or None, True)
                        return self._in_module(origin, [attr, *rest], depth + 1)
                    return Found(None, f"{file}:{key.lineno} (module __getattr__ table)")
        return f"{file}: no {name} (not in its __getattr__ tables)"


def _assigned(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def check(wheel: Path, hooks: tuple[Any, ...]) -> dict[str, Any]:
    resolver = Resolver(Source(wheel))
    rows, problems = [], []
    for hook in hooks:
        found = resolver.resolve(hook.path)
        if isinstance(found, str):
            problems.append(f"{hook.path}: missing ({found})")
            rows.append({"hook": hook.path, "found": None, "why": found})
            continue
        row: dict[str, Any] = {"hook": hook.path, "found": found.where}
        if hook.params is not None:
            row["params"] = list(found.params) if found.params is not None else None
            if found.params is None:
                problems.append(f"{hook.path}: not a function in the source ({found.where})")
            elif found.params != hook.params:
                problems.append(f"{hook.path}: parameters {found.params}, the adapter expects {hook.params}")
        rows.append(row)
    return {"wheel": wheel.name, "hooks": len(hooks), "problems": problems, "checked": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument(
        "--adapter", required=True, help="module under kernelbake.runtime.engines.vllm, e.g. _v0_34"
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    adapter = importlib.import_module(f"kernelbake.runtime.engines.vllm.{args.adapter}")
    doc = {"adapter": args.adapter, **check(args.wheel, adapter.HOOKS)}
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if doc["problems"]:
        print(f"{len(doc['problems'])} of {doc['hooks']} hooks moved or changed", file=sys.stderr)
    return 1 if doc["problems"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
