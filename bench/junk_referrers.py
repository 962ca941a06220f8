"""What look-alike referrers cost ``verify`` of a key-signed or keyless-signed image, and that it
still verifies: a signed kernelbake image in a local Debian docker-registry, its fallback
referrers index filled with junk before and after the real entries, verified by digest with a
fresh client. Keyless signing uses the local Sigstore of the tests (``@sigstore/mock`` behind
node), verified offline from its trusted root.

Kinds of junk (each listed half before, half after the real referrers):
* ``forged-vouch``: every annotation of the real referrers, the trusted key's hint, and a vouch
  for a junk layer with a signature that key never made; ``-fill-4MiB``: as many as Debian's
  docker-registry lets a fallback index hold (it refuses manifests over 4 MiB), the most
  signature checks junk can cause there; the client reads listings of up to 8 MiB
  (``kernelbake.oci.listing``), about twice the checks, on registries that take them.
* ``copied-annotations``: real manifests copying every annotation of the real ones (their vouch
  too), with a junk bundle layer.
* ``predicate-only``: real manifests with cosign's predicate annotation and a junk bundle (what
  denied a signed image when 32 examined candidates was the only rule).
* ``keyless-self-issued-cert``: keyless-signed image; each junk referrer carries a keyless vouch
  with its own certificate claiming the trusted identity (issuer name copied from the real one)
  that the trusted CA never signed, its key signing a vouch for a junk layer and this image
  (``-fill-4MiB``: as many as the registry's 4 MiB index holds: the most chain checks junk can
  cause there).
* ``keyless-predicate-only``: keyless-signed image, junk as ``predicate-only``.

For each: verified or not, seconds (worst of ``--runs``), listing bytes, body bytes read,
signature verifications by keys, and registry requests made.
Prints JSON and writes bench/results/junk_referrers.json.

    .venv/bin/python bench/junk_referrers.py [--count 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests
from cryptography import x509

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.admission import live  # noqa: E402
from tests.signing.conftest import ISSUER, SUBJECT, make_token, mock_sigstore  # noqa: E402
from tests.signing.images import PushedImage  # noqa: E402
from tests.signing.tamper import list_around, push_lookalikes  # noqa: E402
from tests.signing.test_junk_keyless import JUNK_LAYER, _self_issued, _sign  # noqa: E402
from tests.support.registry import running_registry  # noqa: E402

from kernelbake import __version__  # noqa: E402
from kernelbake.oci import RegistryClient  # noqa: E402
from kernelbake.oci.client import MAX_MANIFEST_BYTES  # noqa: E402
from kernelbake.oci.types import sha256_digest  # noqa: E402
from kernelbake.settings import Settings  # noqa: E402
from kernelbake.signing import formats, intoto  # noqa: E402
from kernelbake.signing._internal.keyless import load_trust_config  # noqa: E402
from kernelbake.signing.keys import PublicKey, generate_key_pair, load_private_key  # noqa: E402
from kernelbake.signing.policy import VerifyPolicy  # noqa: E402
from kernelbake.signing.sign import sign_image  # noqa: E402
from kernelbake.signing.signer import KeylessSigner  # noqa: E402
from kernelbake.signing.verify import verify_image  # noqa: E402

RESULTS = REPO / "bench" / "results" / "junk_referrers.json"
REPOSITORY = "kernelbake/junk"


class _Counters:
    def __init__(self) -> None:
        self.bytes = 0
        self.verifications = 0
        self.requests = 0


def _counting(counters: _Counters) -> None:
    real_iter = requests.Response.iter_content
    real_verifies = PublicKey.verifies
    real_request = RegistryClient._request

    def iter_content(self: requests.Response, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for chunk in real_iter(self, *args, **kwargs):
            counters.bytes += len(chunk)
            yield chunk

    def verifies(self: PublicKey, signature: bytes, data: bytes) -> bool:
        counters.verifications += 1
        return real_verifies(self, signature, data)

    def request(self: RegistryClient, *args: Any, **kwargs: Any) -> Any:
        counters.requests += 1
        return real_request(self, *args, **kwargs)

    requests.Response.iter_content = iter_content  # type: ignore[method-assign]
    RegistryClient._request = request  # type: ignore[method-assign]
    PublicKey.verifies = verifies  # type: ignore[method-assign]


def _forge(real: list[dict[str, Any]], forger: Any) -> Callable[[int], dict[str, str]]:
    """Annotations: the real ones, vouching for a junk layer with a signature by another key."""
    junk_layer = sha256_digest(b"junk")

    def annotate(i: int) -> dict[str, str]:
        payload = formats.vouch_payload("sha256:" + f"{i:064x}", junk_layer)
        vouch = {
            formats.ANN_VOUCH_LAYER: junk_layer,
            formats.ANN_VOUCH_SIGNATURE: base64.b64encode(forger.sign(payload)).decode(),
        }
        return {**real[i % len(real)]["annotations"], **vouch}

    return annotate


def _self_issued_vouches(real: list[dict[str, Any]], subject: str) -> Callable[[int], dict[str, str]]:
    """Annotations: the real ones, with a keyless vouch for a junk layer by a certificate of its
    own per entry, claiming the trusted identity, that the trusted CA never signed."""
    leaf = x509.load_der_x509_certificate(
        base64.b64decode(real[0]["annotations"][formats.ANN_VOUCH_CERTIFICATE])
    )

    def annotate(i: int) -> dict[str, str]:
        certificate, key = _self_issued(leaf)
        return {
            **real[i % len(real)]["annotations"],
            formats.ANN_VOUCH_LAYER: JUNK_LAYER,
            formats.ANN_VOUCH_CERTIFICATE: certificate,
            formats.ANN_VOUCH_SIGNATURE: _sign(key, subject, JUNK_LAYER),
        }

    return annotate


def _fill_count(real: list[dict[str, Any]], annotate: Callable[[int], dict[str, str]]) -> int:
    """How many forged entries fit in one fallback index under Debian's registry's 4 MiB
    manifest limit (the client's manifest limit is the same number)."""
    entry = {**real[0], "digest": "sha256:" + "0" * 64, "size": 1000, "annotations": annotate(0)}
    # With spaces after separators (more than the index takes), and 64 KiB to spare.
    one = len(json.dumps(entry)) + 2
    listed = len(json.dumps({"schemaVersion": 2, "mediaType": "x", "manifests": real}))
    return (MAX_MANIFEST_BYTES - listed - (64 << 10)) // one


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=1000, help="junk manifests pushed per kind")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    counters = _Counters()
    _counting(counters)
    results: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_registry(Path(tmp) / "registry") as registry,
        mock_sigstore(Path(tmp) / "sigstore") as sigstore,
    ):
        work = Path(tmp)
        key_path, pub_path = generate_key_pair(work / "keys", name="trusted")
        forger = load_private_key(generate_key_pair(work / "keys", name="forger")[0])
        key_policy = VerifyPolicy.from_mapping({"keys": [str(pub_path)]}, source="bench")
        keyless_policy = VerifyPolicy.from_mapping(
            {
                "identities": [{"issuer": ISSUER, "subject": SUBJECT}],
                "trusted_root": str(sigstore.trusted_root),
            },
            source="bench",
        )
        client = RegistryClient(Settings(docker_config=work / "docker-config"), timeout=30)

        def signed(name: str, keyless: bool) -> tuple[PushedImage, list[dict[str, Any]]]:
            image = live.push_target(registry, REPOSITORY, name, "h100", work / name)
            if keyless:
                signer = KeylessSigner(load_trust_config(str(sigstore.trust_config)), make_token())
                sign_image(image.tagged, signer, client=client)
            else:
                live.sign(image, key_path)
            ref = image.ref.with_digest(image.digest)
            return image, [d.to_json() for d in client.referrers(ref)]

        Annotate = Callable[[int], dict[str, str]]
        predicate = {formats.ANN_BUNDLE_PREDICATE: intoto.COSIGN_SIGN_PREDICATE}
        forged: Callable[[list[dict[str, Any]], str], Annotate] = lambda real, _: _forge(real, forger)  # noqa: E731
        cases: list[tuple[str, Callable[[list[dict[str, Any]], str], Annotate], int | None, bool]] = [
            ("forged-vouch", forged, args.count, False),
            ("forged-vouch-fill-4MiB", forged, None, False),
            (
                "copied-annotations",
                lambda real, _: lambda i: {**real[i % len(real)]["annotations"], "junk": str(i)},
                args.count,
                False,
            ),
            ("predicate-only", lambda real, _: lambda i: {**predicate, "junk": str(i)}, args.count, False),
            ("keyless-self-issued-cert", _self_issued_vouches, args.count, True),
            ("keyless-self-issued-cert-fill-4MiB", _self_issued_vouches, None, True),
            (
                "keyless-predicate-only",
                lambda real, _: lambda i: {**predicate, "junk": str(i)},
                args.count,
                True,
            ),
        ]
        for n, (name, annotate, count, keyless) in enumerate(cases):
            image, real = signed(f"case{n}", keyless)
            make = annotate(real, image.digest)
            count = count if count is not None else _fill_count(real, make)
            half = count // 2
            before = push_lookalikes(client, image, half, make)
            after = push_lookalikes(
                client, image, count - half, lambda i, make=make, half=half: make(half + i)
            )
            list_around(client, image, before, after)
            policy = keyless_policy if keyless else key_policy
            worst, read, checks, calls, outcome = 0.0, 0, 0, 0, ""
            for _ in range(args.runs):
                fresh = RegistryClient(client.settings, timeout=30)
                counters.bytes = counters.verifications = counters.requests = 0
                started = time.monotonic()
                try:
                    verified = verify_image(image.pinned, policy, client=fresh)
                    outcome = f"verified, signed by {verified.signer}"
                except Exception as exc:  # reported, not raised: the bench records it
                    outcome = f"FAILED: {type(exc).__name__}: {exc}"
                worst = max(worst, time.monotonic() - started)
                read, checks = max(read, counters.bytes), max(checks, counters.verifications)
                calls = max(calls, counters.requests)
            results.append(
                {
                    "junk": name,
                    "junk_referrers": count,
                    "outcome": outcome,
                    "seconds_worst": round(worst, 3),
                    "body_bytes_read": read,
                    "signature_verifications": checks,
                    "registry_requests": calls,
                }
            )
            print(json.dumps(results[-1]), file=sys.stderr)
    doc = {
        "bench": "junk_referrers",
        "kernelbake": __version__,
        "machine": {"cpus": len(os.sched_getaffinity(0)), "python": platform.python_version()},
        "runs": args.runs,
        "results": results,
    }
    text = json.dumps(doc, indent=2)
    print(text)
    RESULTS.write_text(text + "\n")
    return 0 if all(r["outcome"].startswith("verified") for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
