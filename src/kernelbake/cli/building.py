"""``render``, ``build`` and ``inspect``: the host side of an image's life."""

from __future__ import annotations

import argparse
import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelbake._wheel import build_wheel
from kernelbake.bake import bakefile
from kernelbake.cli.planning import add_spec_args
from kernelbake.pipeline import BuildOptions, Driver, Publish
from kernelbake.plan import plan
from kernelbake.render import BuildMode, render, write_context
from kernelbake.settings import Settings
from kernelbake.spec import load_spec

# kernelbake.remote needs requests (host only); ``inspect`` imports it when it runs, so that
# this module loads inside images too.
if TYPE_CHECKING:
    from kernelbake.inspection import IndexListing


def _add_choice(p: argparse.ArgumentParser, flag: str, default: enum.Enum, help: str) -> None:
    """An option whose values are the wire strings of ``default``'s Enum, parsed into a member."""
    kind = type(default)
    p.add_argument(
        flag,
        type=kind,
        choices=list(kind),
        metavar="{" + ",".join(m.value for m in kind) + "}",
        default=default,
        help=help,
    )


def _add_build_args(p: argparse.ArgumentParser) -> None:
    _add_choice(
        p,
        "--mode",
        BuildMode.SINGLE,
        "single: one build, GPU compile via RUN --device (labs frontend); "
        "two-phase: compile in docker run --device, final build takes the result as a named context",
    )
    p.add_argument("--cdi-device", help="CDI device for the compile step instead of the GPU catalogue's")
    p.add_argument("--out", type=Path, help="build directory (default: $KERNELBAKE_BUILD_DIR or build/)")


def cmd_render(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    out: Path = (args.out or settings.build_dir).resolve()
    targets = plan(load_spec(args.spec), args.gpu, registry=args.registry or settings.registry)
    wheel = build_wheel(out / "wheels")
    groups = {}
    for t in targets:
        rendered = render(t, wheel=wheel.name, mode=args.mode, device=args.cdi_device)
        layout = bakefile.Layout(out / t.name)
        write_context(rendered, layout.context, wheel, settings.criu)
        groups[t.name] = bakefile.bake_targets(rendered, layout, push=False)
        print(f"{t.name}\t{layout.context / 'Dockerfile'}")
    bake_file = out / "docker-bake.json"
    bake_file.write_text(bakefile.dumps(bakefile.bake_document(groups)))
    print(f"bake file\t{bake_file}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    registry = args.push or args.registry or settings.registry
    targets = plan(load_spec(args.spec), args.gpu, registry=registry)
    options = BuildOptions(
        out=args.out or settings.build_dir,
        push=bool(args.push),
        mode=args.mode,
        device=args.cdi_device,
        max_parallel=args.max_parallel,
        publish=args.publish,
    )
    built = Driver(settings).build(targets, options)
    for b in built:
        print(f"built\t{b.ref}")
        if b.pushed:
            print(f"pushed\t{b.pushed}")
        if b.cache is not None:
            print(f"cache\t{b.cache.pushed or b.cache.ref}")
    pushed = [p for b in built for p in b.published]
    # A cache artifact is found through the index (resolve, admission), so even one gets one.
    if len(pushed) > 1 or any(b.cache is not None and b.cache.pushed for b in built):
        # Every target is pushed (the pipeline raised otherwise): one index lists them all.
        from kernelbake.oci import RegistryClient
        from kernelbake.publish.index import publish_index

        print(f"index\t{publish_index(pushed, client=RegistryClient(settings, timeout=30.0))}")
    return 0


def _print_summary(doc: dict[str, Any]) -> None:
    print(f"image:      {doc['ref']}")
    print(f"pullable:   {doc['pullable']}")
    gpu = doc["gpu"] or "not in this kernelbake's GPU catalogue"
    print(f"gpu:        {gpu} (from the key's device)")
    if doc["labels_consistent"]:
        print(f"key digest: {doc['key_digest']} (labels consistent with the key)")
    else:
        print(f"key digest: {doc['key_digest']} (labels INCONSISTENT with the key)")
        for problem in doc["label_problems"]:
            print(f"  {problem}")
    print(f"key:        {doc['key']}")
    if doc["artifact"]:
        art = doc["artifact"]
        engine = art["engineImage"]
        print(f"artifact:   cache-only, the caches at /opt/kernelbake/cache of {engine['name']}")
        print(
            f"  engine:   config {engine['config']}, manifest {engine['digest'] or 'unknown (built from a local image)'}"
        )
        print(f"  command:  {' '.join(art['command'])}")
    if doc["unattested_labels"]:
        print("unattested: (labels outside the key; nothing checks them)")
        for name, value in doc["unattested_labels"].items():
            print(f"  {name}={value}")


def _print_index(args: argparse.Namespace, listing: IndexListing) -> None:
    """A model's GPU-variant index: the table of its variants."""
    if args.json:
        print(json.dumps(listing.to_json(), indent=2))
        return
    rows = listing.rows()
    print(f"index:      {listing.index.ref.pinned()} ({len(rows)} variants; kernelbake resolve picks one)")
    columns = ("kind", "device", "arch", "engine", "key_digest", "digest")
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    print("  ".join(c.replace("_", " ").ljust(widths[c]) for c in columns).rstrip())
    for r in rows:
        print("  ".join(r[c].ljust(widths[c]) for c in columns).rstrip())


def cmd_inspect(args: argparse.Namespace) -> int:
    from kernelbake.fleet import read_top
    from kernelbake.inspection import IndexListing, Inspection
    from kernelbake.oci import RegistryClient, parse_reference
    from kernelbake.remote import inspect_remote, registry_reachable

    client = RegistryClient(Settings.from_env(), timeout=args.timeout)
    with registry_reachable(parse_reference(args.ref).registry):
        # One read of the reference: what is shown is what the tag named at that read.
        top, index = read_top(args.ref, client=client)
    if index is not None:
        _print_index(args, IndexListing(args.ref, index))
        return 0
    inspection = Inspection(inspect_remote(args.ref, client=client, top=top))
    doc = inspection.to_json()
    consistent = inspection.consistent
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    _print_summary(doc)
    cm = doc["cache_manifest"]
    if cm is None:
        print("cache:      no cache manifest in the last layer")
        return 1
    match = "matches" if cm["key_matches_labels"] else "DIFFERS FROM"
    print(f"cache:      manifest {cm['digest']} ({cm['files']} files; key {match} the labels)")
    for kind, t in sorted(cm["kinds"].items()):
        print(f"  {kind:<12} {t['files']:>6} files {t['bytes'] / 1e6:>10.2f} MB")
    print(f"builder:    {json.dumps(cm['builder'], sort_keys=True)}")
    return 0 if consistent else 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("render", help="write the Dockerfile, build context and bake file (no build)")
    add_spec_args(p)
    p.add_argument("--registry", help="repository prefix for tags (default: $KERNELBAKE_REGISTRY)")
    _add_build_args(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("build", help="render and build with Docker; push only complete images")
    add_spec_args(p)
    p.add_argument("--push", metavar="REGISTRY", help="push to REGISTRY (e.g. 127.0.0.1:5000/kernelbake)")
    p.add_argument("--registry", help="repository prefix for local tags when not pushing")
    p.add_argument(
        "--max-parallel",
        type=int,
        metavar="N",
        help="GPU families built at once, each on its own builder (default: all)",
    )
    _add_choice(
        p,
        "--publish",
        Publish.IMAGE,
        "push the image (default), the cache-only artifact for the stock engine image "
        "(REPO:TAG-cache, mountable as an image volume), or both; all go in the variant index",
    )
    _add_build_args(p)
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("inspect", help="labels, key and cache manifest of a pushed image")
    p.add_argument("ref", help="REGISTRY/REPO:TAG or REGISTRY/REPO@sha256:...")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds per registry call, connect to last byte (default 30)",
    )
    p.set_defaults(func=cmd_inspect)
