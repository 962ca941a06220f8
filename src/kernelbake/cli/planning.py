"""``plan`` and ``key``: pure views of what a build would produce."""

from __future__ import annotations

import argparse
import json

from kernelbake.plan import plan
from kernelbake.settings import Settings
from kernelbake.spec import load_spec


def _gpus(value: str) -> list[str]:
    return [g.strip() for g in value.split(",") if g.strip()]


def add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="image spec (images/<model>.yaml)")
    p.add_argument(
        "--gpu", type=_gpus, default=[], help="GPU name(s), comma-separated, or 'all' (default: all targets)"
    )


def cmd_plan(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    targets = plan(load_spec(args.spec), args.gpu, registry=args.registry or settings.registry)
    if args.print:
        print(json.dumps({"targets": [t.to_json() for t in targets]}, indent=2))
    else:
        for t in targets:
            print(f"{t.name}\t{t.ref}\t{t.key.short_digest}")
    return 0


def cmd_key(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    for t in plan(load_spec(args.spec), args.gpu, registry=args.registry or settings.registry):
        print(str(t.key))
        print(f"digest: {t.key.digest}")
        print(f"tag:    {t.tag}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="resolve targets, tags, labels and keys (no build)")
    add_spec_args(p)
    p.add_argument("--registry", help="repository prefix for tags (default: $KERNELBAKE_REGISTRY)")
    p.add_argument("--print", action="store_true", help="print the fully resolved plan as JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("key", help="print the canonical compatibility key and tag")
    add_spec_args(p)
    p.add_argument("--registry", help="repository prefix for tags")
    p.set_defaults(func=cmd_key)
