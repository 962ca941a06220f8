"""The registry options of the commands that talk to one (``sign``, ``verify``, ``capture push``
and ``capture verify``, ``snapshot push`` and ``snapshot verify``), the client they make, and the
push and verify steps that ``capture`` and ``snapshot`` share for the artifacts that refer to an
image. Its own module, importing nothing at load, so that an in-image command's parser can take
the options without loading host code."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kernelbake.oci import RegistryClient
    from kernelbake.settings import Settings
    from kernelbake.signing.signer import Signer


def add_registry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds per registry call, connect to last byte (default 10; a blob upload gets 1 s more per 8 MiB)",
    )
    p.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST",
        help="talk plain HTTP to HOST (loopback registries always are); repeatable",
    )


def client(args: argparse.Namespace, settings: Settings | None = None) -> RegistryClient:
    from kernelbake.oci import RegistryClient
    from kernelbake.settings import Settings

    settings = settings or Settings.from_env()
    insecure = (*settings.insecure_registries, *args.insecure_registry)
    return RegistryClient(settings, timeout=args.timeout, insecure_hosts=insecure)


def signer(args: argparse.Namespace) -> Signer:
    """The signer ``--key`` or ``--keyless`` names (``push_parser``)."""
    from kernelbake.settings import Settings
    from kernelbake.signing.signer import signer_from_settings

    return signer_from_settings(Settings.from_env(), key=args.key, keyless=args.keyless)


def push_parser(
    inner: argparse._SubParsersAction[argparse.ArgumentParser],
    *,
    help: str,
    dir_help: str,
    base_help: str,
    to_help: str,
    func: Callable[[argparse.Namespace], int],
    extra: Callable[[argparse.ArgumentParser], None] = lambda _: None,
) -> None:
    """``push DIR --base IMAGE@sha256:… [--to REPO:TAG]``, signed by ``--key`` or ``--keyless``;
    ``extra`` adds the step's own options after ``--to``."""
    c = inner.add_parser("push", help=help)
    c.add_argument("dir", type=Path, metavar="DIR", help=dir_help)
    c.add_argument("--base", required=True, metavar="IMAGE@sha256:…", help=base_help)
    c.add_argument("--to", metavar="REPO:TAG", help=to_help)
    extra(c)
    who = c.add_mutually_exclusive_group(required=True)
    who.add_argument("--key", type=Path, metavar="KEY", help="sign with this cosign private key")
    who.add_argument("--keyless", action="store_true", help="sign keyless (sigstore)")
    _json_and_registry(c, func)


def verify_parser(
    inner: argparse._SubParsersAction[argparse.ArgumentParser],
    *,
    help: str,
    name: str,
    ref_help: str,
    base_help: str,
    func: Callable[[argparse.Namespace], int],
) -> None:
    """``verify REF --base IMAGE@sha256:… --policy FILE``; ``name`` is REF's attribute."""
    c = inner.add_parser("verify", help=help)
    c.add_argument(name, metavar=name.upper(), help=ref_help)
    c.add_argument("--base", required=True, metavar="IMAGE@sha256:…", help=base_help)
    c.add_argument("--policy", type=Path, required=True, help="the verify policy (keys or identities)")
    _json_and_registry(c, func)


def _json_and_registry(c: argparse.ArgumentParser, func: Callable[[argparse.Namespace], int]) -> None:
    c.add_argument("--json", action="store_true")
    add_registry_args(c)
    c.set_defaults(func=func)


class Described(Protocol):
    def describe(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


def report(command: str, done: Described, args: argparse.Namespace) -> int:
    """What a push or a verification did, in one line, and with ``--json`` as JSON too."""
    print(f"kernelbake {command}: {done.describe()}")
    if args.json:
        print(json.dumps(done.to_json(), indent=1, sort_keys=True))
    return 0
