"""``resolve``: which variant of a model's GPU index a GPU should run, best first, like pip."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kernelbake.errors import BadInput, KeyMismatch
from kernelbake.settings import Settings


def cmd_resolve(args: argparse.Namespace) -> int:
    # Host-only modules (requests): imported when the command runs, so the CLI loads in images.
    from kernelbake import fleet
    from kernelbake.oci import RegistryClient

    if args.gpu_product:
        found = fleet.found_for_product(args.gpu_product)
    elif args.node_labels:
        found = fleet.found_for_labels(fleet.parse_labels(args.node_labels))
    else:
        found = fleet.found_here()
    from kernelbake.oci import parse_reference
    from kernelbake.remote import registry_reachable

    client = RegistryClient(Settings.from_env(), timeout=30.0)
    with registry_reachable(parse_reference(args.ref).registry):
        index = fleet.read_index(args.ref, client=client)
    if index is None:
        raise BadInput(
            f"{args.ref}: not a kernelbake GPU-variant index (kernelbake inspect shows what it is)"
        )
    from kernelbake.contract.artifact import ArtifactKind

    kind = ArtifactKind.CACHE if args.cache_artifact else ArtifactKind.IMAGE
    resolution = fleet.resolve(index, found, kind)
    best = resolution.best
    rows: list[dict[str, Any]] = [
        {
            "rank": i + 1,
            "device": resolution.variant(c).key.device,
            "arch": resolution.variant(c).key.arch,
            "tier": c.tier.value,
            "fits": c.fits,
            "digest": resolution.variant(c).digest,
            "reasons": [str(r) for r in c.match.reasons],
        }
        for i, c in enumerate(resolution.candidates)
    ]
    run = index.pinned(resolution.variant(best)) if best is not None else None
    if args.json:
        print(
            json.dumps({"index": index.ref.pinned(), "found": found, "variants": rows, "run": run}, indent=2)
        )
    else:
        print(f"index: {index.ref.pinned()}")
        print(f"for:   {', '.join(f'{k} {v!r}' for k, v in found.items())}")
        for row in rows:
            why = "; ".join(row["reasons"]) or "exact match"
            print(f"  {row['rank']}. {row['device']} ({row['arch']}): {row['tier']} — {why}")
        if run is not None:
            print(f"run:   {run}")
    if best is None:
        what = "cache artifact" if args.cache_artifact else "variant"
        raise KeyMismatch(f"{index.ref.pinned()}: no {what} fits; every one would start cold or cannot run")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "resolve",
        help="the variant of a GPU index to run on a GPU, best first with reasons (exit 6: none fits)",
    )
    p.add_argument("ref", help="the model's index: REGISTRY/REPO:TAG or REGISTRY/REPO@sha256:...")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--gpu-product", metavar="NAME", help="a GFD product label value, e.g. NVIDIA-H100-80GB-HBM3"
    )
    which.add_argument(
        "--node-labels", metavar="K=V,...", help="a node's labels, e.g. nvidia.com/gpu.product=NVIDIA-H200"
    )
    which.add_argument("--here", action="store_true", help="this machine's GPU (nvidia-smi), the default")
    p.add_argument(
        "--cache-artifact",
        action="store_true",
        help="pick the cache-only artifact (for a stock engine image) instead of the image",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_resolve)
