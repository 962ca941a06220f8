"""``kernelbake capture``: a running replica's warm state as a signed delta for the next one.

``record``, ``replay`` and ``collect`` run inside the image (or a sidecar from it); ``rebuild``,
``push`` and ``verify`` on the host. Each imports its side lazily, so the in-image commands
never load host code."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kernelbake.cli._in_image import IN_IMAGE
from kernelbake.cli._registry import client as registry_client
from kernelbake.cli._registry import push_parser, report, signer, verify_parser


def _say(lines: Iterable[str]) -> None:
    """A step's summary on stdout, each line prefixed as every capture step's is."""
    for line in lines:
        print(f"kernelbake capture: {line}")


def cmd_collect(args: argparse.Namespace) -> int:
    from kernelbake.runtime.capture.collect import collect
    from kernelbake.runtime.env import RuntimeEnv

    done = collect(RuntimeEnv.from_env(), args.out, root=args.root, replica=args.replica)
    _say(done.lines())
    if args.json:
        print(done.delta.to_json(), end="")
    return 0


def _request(text: str) -> dict[str, Any]:
    from kernelbake.contract.record import request_problem

    try:
        body = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text[:80]!r}") from None
    if problem := request_problem(body):
        raise argparse.ArgumentTypeError(problem)
    return dict(body)


def cmd_record(args: argparse.Namespace) -> int:
    from kernelbake.runtime.capture.record import record
    from kernelbake.runtime.env import RuntimeEnv

    done = record(
        RuntimeEnv.from_env(),
        args.out,
        list(args.request),
        root=args.root,
        replica=args.replica,
        notes=args.notes,
    )
    _say(done.lines())
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from kernelbake.runtime.capture import replay
    from kernelbake.runtime.env import RuntimeEnv

    done = replay.replay(replay.load(RuntimeEnv.from_env(), args.record), port=args.port)
    _say(done.lines())
    return 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    from kernelbake.signing.rebuild import rebuild

    done = rebuild(
        args.record, image=args.image, out=args.out, builder=args.builder, docker_args=list(args.docker_arg)
    )
    _say(done.lines())
    if args.json:
        print(json.dumps(done.to_json(), indent=1, sort_keys=True))
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from kernelbake.signing.delta import push_delta

    pushed = push_delta(
        args.dir,
        base=args.base,
        to=args.to,
        signer=signer(args),
        replica=args.replica,
        client=registry_client(args),
        unsafe_replica_bytes=args.unsafe_replica_bytes,
    )
    return report("capture", pushed, args)


def cmd_verify(args: argparse.Namespace) -> int:
    from kernelbake.signing.delta import verify_delta
    from kernelbake.signing.policy import load_policy

    policy = load_policy(args.policy)
    verified = verify_delta(args.delta, base=args.base, policy=policy, client=registry_client(args))
    return report("capture", verified, args)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "capture",
        help=IN_IMAGE + "collect a replica's new cache files as a delta (push and verify run on the host)",
    )
    inner = p.add_subparsers(dest="capture_command", required=True, metavar="STEP")
    _in_image_steps(inner)
    _rebuild_step(inner)
    push_parser(
        inner,
        help="push DIR as a delta artifact layered on BASE, signed and attested",
        dir_help="what 'capture collect' wrote",
        base_help="the image the replica ran",
        to_help="where to push (default: BASE's repository, tag delta-sha256-<BASE's digest>)",
        func=cmd_push,
        extra=_push_options,
    )
    verify_parser(
        inner,
        help="check a delta as admission does: signature, key, base digest",
        name="delta",
        ref_help="REPO:TAG or REPO@sha256:… of the delta",
        base_help="the image it must be layered on",
        func=cmd_verify,
    )


def _in_image_steps(inner: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = inner.add_parser(
        "collect", help="(inside the image) write the files the caches gained since the bundle to DIR"
    )
    c.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new or empty directory")
    c.add_argument("--root", type=Path, help="the live cache root (default: the image's cache root)")
    c.add_argument("--replica", default="", help="a name for this replica, recorded in the delta")
    c.add_argument("--json", action="store_true", help="print the delta manifest too")
    c.set_defaults(func=cmd_collect)

    c = inner.add_parser(
        "record",
        help="(inside the image) record what this replica compiled that the build had not (the request classes "
        "serve noted, the files as claims), for a rebuild",
    )
    c.add_argument("--out", type=Path, required=True, metavar="FILE", help="the record to write (a new file)")
    c.add_argument(
        "--request",
        type=_request,
        action="append",
        default=[],
        metavar="JSON",
        help="a request class to rebuild besides those serve noted (a completion request's body, with its "
        "prompt, without model), sent alone; repeat",
    )
    c.add_argument(
        "--notes",
        type=Path,
        metavar="FILE",
        help="where serve noted the batches that compiled (default: $KERNELBAKE_MISS_NOTES, "
        "$KERNELBAKE_SCRATCH/kernelbake-misses.jsonl)",
    )
    c.add_argument("--root", type=Path, help="the live cache root (default: the image's cache root)")
    c.add_argument("--replica", default="", help="a name for this replica, recorded")
    c.set_defaults(func=cmd_record)

    c = inner.add_parser(
        "replay",
        help="(inside the image, in a rebuild) send a record's batches to this server, each batch at once",
    )
    c.add_argument("--record", type=Path, required=True, metavar="FILE", help="what 'capture record' wrote")
    c.add_argument("--port", type=int, default=8000, help="the server's port on the loopback")
    c.set_defaults(func=cmd_replay)


def _rebuild_step(inner: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = inner.add_parser(
        "rebuild", help="compile a record again in the signed image (no network), as a delta to push"
    )
    c.add_argument("record", type=Path, metavar="RECORD", help="what 'capture record' wrote")
    c.add_argument("--image", required=True, metavar="IMAGE@sha256:…", help="the image the replica ran")
    c.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new or empty directory")
    c.add_argument("--builder", required=True, help="this builder's name, recorded in the delta and attested")
    c.add_argument(
        "--docker-arg", action="append", default=[], help="passed to docker run (e.g. --gpus=all); repeat"
    )
    c.add_argument("--json", action="store_true", help="print what was reproduced, differed and dropped")
    c.set_defaults(func=cmd_rebuild)


def _push_options(c: argparse.ArgumentParser) -> None:
    c.add_argument(
        "--unsafe-replica-bytes",
        action="store_true",
        help="push a delta of the bytes a replica wrote ('capture collect'), not rebuilt; refused by default policies",
    )
    c.add_argument("--replica", default=None, help="the replica's name for the attestation (default: DIR's)")
