"""The registry options of the commands that talk to one (``sign``, ``verify``, ``capture push``
and ``capture verify``), and the client they make. Its own module, importing nothing at load,
so that an in-image command's parser can take the options without loading host code."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernelbake.oci import RegistryClient
    from kernelbake.settings import Settings


def add_registry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds per registry call, connect to last byte (default 10)",
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
