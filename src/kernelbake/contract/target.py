"""What the host tells the code inside the image: one JSON file, ``/opt/kernelbake/target.json``.

Written by ``render`` from a ``BuildTarget``; read by ``kernelbake compile`` in the build stage
and by ``kernelbake serve``/``check`` at run time, so both sides see the same facts.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kernelbake.contract.key import CacheKey, parse_key
from kernelbake.contract.layout import CACHE_ROOT, TARGET_FILE
from kernelbake.contract.serve import Dtype, Quantization, ServeArgs
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
        s = self.serve
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "key": str(self.key),
            "gpu": self.gpu,
            "cache_root": self.cache_root,
            "shapes": [list(p) for p in self.shapes],
            "serve": {
                "dtype": s.dtype.value,
                "quantization": s.quantization.value,
                "tensor_parallel_size": s.tensor_parallel_size,
                "pipeline_parallel_size": s.pipeline_parallel_size,
                "expert_parallel_size": s.expert_parallel_size,
                "max_model_len": s.max_model_len,
                "max_num_batched_tokens": s.max_num_batched_tokens,
                "max_num_seqs": s.max_num_seqs,
                "compilation_config": json.loads(s.compilation_config),
                "env": dict(s.env),
                "extra_args": list(s.extra_args),
            },
        }
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "target.json") -> TargetConfig:
        try:
            doc = json.loads(text)
            if doc.get("schema") != SCHEMA:
                raise BadInput(f"{source}: schema {doc.get('schema')!r} is not {SCHEMA}; rebuild the image")
            s = doc["serve"]
            serve = ServeArgs(
                dtype=Dtype(s["dtype"]),
                quantization=Quantization(s["quantization"]),
                tensor_parallel_size=int(s["tensor_parallel_size"]),
                pipeline_parallel_size=int(s["pipeline_parallel_size"]),
                expert_parallel_size=int(s["expert_parallel_size"]),
                max_model_len=int(s["max_model_len"]),
                max_num_batched_tokens=int(s["max_num_batched_tokens"]),
                max_num_seqs=int(s.get("max_num_seqs", ServeArgs.max_num_seqs)),
                compilation_config=json.dumps(s["compilation_config"], sort_keys=True, separators=(",", ":")),
                env=tuple(sorted((str(k), str(v)) for k, v in s["env"].items())),
                extra_args=tuple(str(a) for a in s["extra_args"]),
            )
            return cls(
                key=parse_key(doc["key"]),
                gpu=str(doc["gpu"]),
                serve=serve,
                shapes=tuple((int(b), int(t)) for b, t in doc["shapes"]),
                cache_root=str(doc["cache_root"]),
            )
        except BadInput:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BadInput(
                f"{source}: not a valid kernelbake target file ({type(exc).__name__}: {exc})"
            ) from None

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
