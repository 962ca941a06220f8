"""``kernelbake snapshot``: a baked engine's process tree, dumped once and restored by ``serve``.

``take`` runs inside the image (a container with CRIU's capabilities); ``push`` and
``verify`` on the host. Each imports its side lazily, so the in-image command never loads
host code."""

from __future__ import annotations

import argparse
from pathlib import Path

from kernelbake.cli._in_image import IN_IMAGE
from kernelbake.cli._registry import client as registry_client
from kernelbake.cli._registry import push_parser, report, signer, verify_parser


def cmd_take(args: argparse.Namespace) -> int:
    from kernelbake.contract.snapshot import Weights
    from kernelbake.runtime.env import RuntimeEnv
    from kernelbake.runtime.snapshot.criu import Criu
    from kernelbake.runtime.snapshot.driver import machine_driver
    from kernelbake.runtime.snapshot.take import Options, take

    env = RuntimeEnv.from_env()
    options = Options(
        image=args.image_digest,
        user_args=tuple(args.engine_args),
        port=args.port,
        warmup_requests=args.warmup,
        deadline_s=args.deadline,
        weights=Weights(args.weights),
    )
    done = take(env, args.out, options, driver=machine_driver(), criu=Criu(env.criu))
    for line in done.lines():
        print(f"kernelbake snapshot: {line}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from kernelbake.signing.snapshot import push_snapshot

    pushed = push_snapshot(
        args.dir, base=args.base, to=args.to, signer=signer(args), client=registry_client(args)
    )
    return report("snapshot", pushed, args)


def cmd_verify(args: argparse.Namespace) -> int:
    from kernelbake.signing.policy import load_policy
    from kernelbake.signing.snapshot import verify_snapshot

    policy = load_policy(args.policy)
    verified = verify_snapshot(args.snapshot, base=args.base, policy=policy, client=registry_client(args))
    return report("snapshot", verified, args)


def _digest(text: str) -> str:
    from kernelbake.contract.manifest import DIGEST

    if not DIGEST.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected sha256:<64 hex>, got {text!r}")
    return text


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "snapshot",
        help=IN_IMAGE + "dump the warmed engine's process tree with CRIU (push and verify run on the host)",
    )
    inner = p.add_subparsers(dest="snapshot_command", required=True, metavar="STEP")

    c = inner.add_parser(
        "take",
        help="(inside the image, with CRIU's capabilities) start the engine as serve does, warm it, dump it to DIR",
        usage="kernelbake snapshot take --out DIR --image-digest sha256:… [options] [SERVE ARGS...]",
    )
    c.add_argument("--out", type=Path, required=True, metavar="DIR", help="a new or empty directory")
    c.add_argument(
        "--image-digest",
        type=_digest,
        required=True,
        metavar="sha256:…",
        help="the digest of the image this runs",
    )
    c.add_argument(
        "--port",
        type=int,
        default=None,
        help="the port the engine serves on, to check: it is read from the engine's own --port "
        "(default vLLM's 8000), and a different one is refused",
    )
    c.add_argument(
        "--warmup", type=int, default=3, metavar="N", help="requests sent before the dump (default 3)"
    )
    c.add_argument(
        "--deadline",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds a restore may take to answer /health before serve kills it (default 30)",
    )
    c.add_argument(
        "--weights",
        choices=("inside", "outside", "beside"),
        default="inside",
        help="outside: vLLM's sleep mode level 2 before the dump, so the snapshot holds no weights and "
        "serve reloads them from the model's files after the restore (needs --enable-sleep-mode, "
        "VLLM_SERVER_DEV_MODE=1 and --middleware kernelbake.runtime.snapshot.devguard.loopback_only); "
        "beside: asleep too, with the engine's weight memory saved as files in the snapshot, which "
        "serve copies back after the wake-up, no loader run (also needs --worker-extension-cls "
        "kernelbake.runtime.engines.vllm.snapshot_weights.SnapshotWeights)",
    )
    c.set_defaults(func=cmd_take, passthrough=True)

    push_parser(
        inner,
        help="push DIR as a snapshot artifact referring to BASE, signed and attested",
        dir_help="what 'snapshot take' wrote",
        base_help="the image the snapshot was taken from",
        to_help="where to push (default: BASE's repository, tag <tag>-snapshot; snapshot-sha256-<hex> for a BASE named by digest alone)",
        func=cmd_push,
    )
    verify_parser(
        inner,
        help="check a snapshot as admission does: signature, subject, key",
        name="snapshot",
        ref_help="REPO:TAG or REPO@sha256:… of the snapshot artifact",
        base_help="the image it must refer to",
        func=cmd_verify,
    )
