"""Record vLLM's cache identity for a set of serve-flag/env variants (CPU build or GPU).

    PYTHONPATH=src python bench/record_identity.py --model DIR --out tests/fixtures/vllm/NAME.json

Runs the same hook as build and serve (``engines.vllm.predict``): vLLM's own parser and config
builder, then the identity right after the config is built. One document per variant, each in a
fresh process, so vLLM's environment handling is the real one. Used to record the CPU fixtures
that the prediction tests diff.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    "baseline": ({}, []),
    "explicit-default-aot": ({"VLLM_USE_AOT_COMPILE": "1"}, []),
    "logging-debug": ({"VLLM_LOGGING_LEVEL": "DEBUG"}, []),
    "api-key": ({"VLLM_API_KEY": "kb-fixture-secret-1234"}, []),
    "max_model_len-underscore": ({}, ["--max_model_len", "1024"]),
    "max-model-len-same": ({}, ["--max-model-len", "2048"]),
    "max-num-batched-tokens": ({}, ["--max-num-batched-tokens", "1024"]),
    "block-size-32": ({}, ["--block-size", "32"]),
    "max-logprobs-5": ({}, ["--max-logprobs", "5"]),
}
BASE = [
    "--dtype",
    "bfloat16",
    "--max-model-len",
    "2048",
    "--max-num-batched-tokens",
    "2048",
    "--skip-tokenizer-init",
]


def one(model: str, args: list[str]) -> dict[str, Any]:
    from vllm.usage.usage_lib import UsageContext

    from kernelbake.runtime.engines.vllm import identity as ident
    from kernelbake.runtime.engines.vllm.args import with_pins
    from kernelbake.runtime.engines.vllm.compat_layer import parse_serve_argv

    pins = ident.log_level_pins()
    engine_args = parse_serve_argv([*with_pins([model, *BASE], pins), *args])
    config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    return {**ident.identity(config, {}), "pins": pins}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", type=Path)
    p.add_argument("--one", nargs=argparse.REMAINDER)
    a = p.parse_args()
    if a.one is not None:
        print("IDENTITY " + json.dumps(one(a.model, a.one), sort_keys=True))
        return 0
    docs = {}
    for name, (env, args) in VARIANTS.items():
        proc = subprocess.run(
            [sys.executable, __file__, "--model", a.model, "--one", *args],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("IDENTITY ")), None)
        if line is None:
            raise SystemExit(f"{name}: {proc.stderr[-2000:]}")
        docs[name] = {
            "env": {k: ("<secret>" if "KEY" in k else v) for k, v in env.items()},
            "args": args,
            "identity": json.loads(line[9:]),
        }
        print(name, "ok", flush=True)
    assert a.out is not None
    a.out.write_text(json.dumps(docs, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
