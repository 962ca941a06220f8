"""``generate-key-pair``, ``sign`` and ``verify``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbake.cli._registry import add_registry_args
from kernelbake.cli._registry import client as registry_client
from kernelbake.settings import Settings

# Host-side dependencies (requests, cryptography, sigstore) are imported by the commands
# that need them: the same CLI runs inside images, which have none of them.
if TYPE_CHECKING:
    from kernelbake.fleet import FleetIndex
    from kernelbake.oci import RegistryClient
    from kernelbake.signing.policy import VerifyPolicy
    from kernelbake.signing.signer import Signer


def cmd_generate_key_pair(args: argparse.Namespace) -> int:
    from kernelbake.signing.keys import generate_key_pair, load_public_key_file

    settings = Settings.from_env()
    private, public = generate_key_pair(
        Path(args.dir), name=args.name, password=settings.signing_key_password or None, overwrite=args.force
    )
    key = load_public_key_file(public)
    print(f"private key: {private}\npublic key:  {public}\nfingerprint: {key.fingerprint}")
    return 0


def _signer(args: argparse.Namespace, settings: Settings) -> Signer:
    from kernelbake.signing.signer import signer_from_settings

    return signer_from_settings(
        settings,
        keyless=args.keyless,
        key=Path(args.key) if args.key else None,
        trust_config=args.trust_config,
        token_file=Path(args.identity_token_file) if args.identity_token_file else None,
    )


def cmd_sign(args: argparse.Namespace) -> int:
    from kernelbake.fleet import read_top
    from kernelbake.signing.sign import sign_image

    settings = Settings.from_env()
    signer = _signer(args, settings)
    client = registry_client(args, settings)
    top, index = read_top(args.image, client=client)
    if index is not None:
        # A model's GPU index: every variant (signed and attested), then the index itself
        # (signed; what it lists is in its signed bytes).
        for variant in index.variants:
            done = sign_image(index.pinned(variant), signer, client=client, legacy=args.legacy)
            print(f"{done.describe()} ({variant.key.device})", file=sys.stderr)
        args.image, args.no_attest = index.ref.pinned(), True
    result = sign_image(
        args.image, signer, client=client, attest=not args.no_attest, legacy=args.legacy, top=top
    )
    if args.json:
        print(
            json.dumps(
                {
                    "reference": result.reference,
                    "digest": result.digest,
                    "signer": result.signer,
                    "referrers": list(result.referrers),
                    "legacy_tags": list(result.legacy_tags),
                    "already": list(result.already),
                    "predicate": result.predicate.to_json() if result.predicate else None,
                },
                indent=2,
            )
        )
    else:
        print(result.describe())
    return 0


def _policy(args: argparse.Namespace) -> VerifyPolicy:
    from kernelbake.signing.policy import VerifyPolicy, load_policy

    if args.policy:
        return load_policy(args.policy)
    return VerifyPolicy.from_mapping({"keys": list(args.key)}, source="--key")


def cmd_verify(args: argparse.Namespace) -> int:
    from kernelbake.signing.index import read_subject
    from kernelbake.signing.verify import verify_image

    settings = Settings.from_env()
    policy = _policy(args)
    client = registry_client(args, settings)
    top, index = read_subject(args.image, client)
    if index is not None:
        return _verify_index(args, index, policy, client)
    result = verify_image(args.image, policy, client=client, top=top)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(
            f"verified {result.pinned()}: signed by {result.signer}; key {result.key.digest}; "
            f"cache manifest {result.manifest_digest}",
            file=sys.stdout,
        )
        # Junk or other signers' artifacts next to the signature: said, on stderr, not failed on.
        if (note := result.skipped_note()) is not None:
            print(f"kernelbake verify: note: {note}", file=sys.stderr)
    return 0


def _verify_index(
    args: argparse.Namespace, index: FleetIndex, policy: VerifyPolicy, client: RegistryClient
) -> int:
    from kernelbake.oci import parse_reference
    from kernelbake.signing.index import verify_index

    ref = parse_reference(args.image)
    done = verify_index(index, policy, client, tag=ref.tag if ref.digest else None)
    if args.json:
        print(json.dumps(done.to_json(args.image), indent=2))
    else:
        if done.signature is not None:
            print(f"verified index {done.signature.pinned()}: signed by {done.signature.signer}")
        else:
            where = index.ref.pinned()
            print(f"FAILED   index {where}: {str(done.signature_failure).removeprefix(f'{where}: ')}")
        for r in done.variants:
            if r.failure is None and r.verified is not None:
                print(
                    f"verified {r.variant.key.device} ({r.variant.key.arch}) {r.pinned}: signed by "
                    f"{r.verified.signer}; key {r.verified.key.digest}; cache manifest {r.verified.manifest_digest}"
                )
            else:
                why = str(r.failure).removeprefix(f"{r.pinned}: ")
                print(f"FAILED   {r.variant.key.device} ({r.variant.key.arch}) {r.pinned}: {why}")
        notes = [n for n in (done.signature.skipped_note() if done.signature else None,) if n]
        notes += [n for r in done.variants if r.verified and (n := r.verified.skipped_note())]
        for note in notes:
            print(f"kernelbake verify: note: {note}", file=sys.stderr)
    failures = done.failures
    if failures:
        first = failures[0]
        raise type(first)(
            f"{len(failures)} of {len(index.variants) + 1} parts of the GPU index {index.ref.pinned()} "
            f"failed verification; first: {first}"
        )
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("generate-key-pair", help="create an ECDSA P-256 signing key pair")
    p.add_argument("--dir", default="build/signing", help="where to write <name>.key and <name>.pub")
    p.add_argument("--name", default="kernelbake", help="file name stem (default kernelbake)")
    p.add_argument("--force", action="store_true", help="replace an existing key pair")
    p.set_defaults(func=cmd_generate_key_pair)

    p = sub.add_parser("sign", help="sign an image digest and attach a kernelbake attestation")
    p.add_argument("image", help="host/repo:tag or host/repo@sha256:… (the digest is what gets signed)")
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--key", help="private key (default $KERNELBAKE_SIGNING_KEY, else build/signing/kernelbake.key)"
    )
    how.add_argument(
        "--keyless", action="store_true", help="sign with a Fulcio certificate for an OIDC identity"
    )
    p.add_argument(
        "--trust-config",
        help="Sigstore client trust config for --keyless: a file, sigstore-public-good or sigstore-staging "
        "(default $KERNELBAKE_TRUST_CONFIG or sigstore-public-good)",
    )
    p.add_argument("--identity-token-file", help="file holding the OIDC token for --keyless")
    p.add_argument("--no-attest", action="store_true", help="sign only; attach no kernelbake attestation")
    p.add_argument("--legacy", action="store_true", help="also write cosign 2's .sig/.att tags")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_registry_args(p)
    p.set_defaults(func=cmd_sign)

    p = sub.add_parser(
        "verify",
        help="verify an image's signature and kernelbake attestation (a GPU index: it and every variant)",
    )
    p.add_argument("image", help="host/repo:tag, host/repo@sha256:… or host/repo:tag@sha256:…")
    trust = p.add_mutually_exclusive_group(required=True)
    trust.add_argument("--policy", help="policy YAML (trusted identities, keys, trusted_root)")
    trust.add_argument("--key", action="append", help="trust this public key (PEM); repeatable")
    p.add_argument("--json", action="store_true", help="print the verified facts as JSON")
    add_registry_args(p)
    p.set_defaults(func=cmd_verify)
