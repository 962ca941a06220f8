"""What the host tells the code inside the image: one JSON file, ``/opt/kernelbake/target.json``.

Written by ``render`` from a ``BuildTarget``; read by ``kernelbake compile`` in the build stage
and by ``kernelbake serve``/``check`` at run time, so both sides see the same facts. Its JSON
follows the fields (``contract.wire``): a field added here is written and read with no more code.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from kernelbake.contract import jsondoc
from kernelbake.contract.key import CacheKey
from kernelbake.contract.layout import CACHE_ROOT, TARGET_FILE
from kernelbake.contract.serve import ServeArgs
from kernelbake.contract.wire import from_wire, to_wire
from kernelbake.errors import BadInput

SCHEMA = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetConfig:
    key: CacheKey
    gpu: str
    serve: ServeArgs
    shapes: tuple[tuple[int, int], ...]
    cache_root: str = CACHE_ROOT

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, **to_wire(self)}, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "target.json") -> TargetConfig:
        try:
            doc = jsondoc.loads(text)
        except ValueError as exc:
            raise BadInput(f"{source}: not a valid kernelbake target file (not JSON: {exc})") from None
        schema = doc.get("schema") if isinstance(doc, dict) else None
        if schema != SCHEMA:
            raise BadInput(f"{source}: schema {schema!r} is not {SCHEMA}; rebuild the image")
        return from_wire(cls, {k: v for k, v in doc.items() if k != "schema"}, source=source)

    @classmethod
    def load(cls, path: str | Path = TARGET_FILE) -> TargetConfig:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise BadInput(
                f"{p}: cannot read target file: {exc.strerror}; is this a kernelbake image?"
            ) from None
        except UnicodeDecodeError as exc:
            raise BadInput(f"{p}: not a kernelbake target file (byte {exc.start} is not UTF-8)") from None
        return cls.from_json(text, source=str(p))
