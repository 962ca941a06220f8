"""Environment variables as declared data: each side's one reader of the environment
(``kernelbake.settings`` on the host, ``kernelbake.runtime.env`` in images) lists what it reads
in a table of ``Variable`` and reads through ``DeclaredEnv``, which refuses a name the table
lacks. The CLI reference (docs/reference/cli.md, ``make docs``) is generated from the same
tables, so it names every variable the code reads."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import overload


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    # What it does, one sentence (Markdown), as the reference shows it.
    meaning: str
    # The value used when it is unset, as the reference shows it ("" when there is none).
    default: str = ""
    # Set by kernelbake for its own processes; documented so that nobody sets it by accident.
    internal: bool = False


class UndeclaredVariable(KeyError):
    """Code read a variable its side's table does not declare (a bug, caught by the tests)."""


class DeclaredEnv(dict[str, str]):
    """A copy of the environment that may be read only by the names in ``variables``."""

    def __init__(self, environ: Mapping[str, str], variables: Iterable[Variable]) -> None:
        super().__init__(environ)
        self._names = frozenset(v.name for v in variables)

    def _check(self, name: str) -> None:
        if name not in self._names:
            raise UndeclaredVariable(
                f"${name} is read but not declared in its VARIABLES table (docs/reference/cli.md is generated from it)"
            )

    @overload  # type: ignore[override]
    def get(self, key: str, default: None = None, /) -> str | None: ...
    @overload
    def get(self, key: str, default: str, /) -> str: ...
    def get(self, key: str, default: str | None = None, /) -> str | None:
        self._check(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self._check(key)
        return super().__getitem__(key)
