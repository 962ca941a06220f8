"""Latency of ``kernelbake verify`` against a local Debian docker-registry.

* first call: a fresh ``kernelbake verify`` process each time (interpreter start, imports, a new
  connection, referrers discovery) - what a CI step or an admission cold start pays;
* repeated: ``verify_image`` again and again in one process with one ``RegistryClient`` - what
  a long-running admission webhook pays per pod.

Both for a key-signed image and a keyless (local @sigstore/mock) one, each carrying the bundle
referrers and the legacy .sig/.att tags. Prints JSON and writes bench/results/verify_latency.json.

    .venv/bin/python bench/verify_latency.py [--cold 40] [--warm 300]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.signing.conftest import ISSUER, SUBJECT, make_token, mock_sigstore  # noqa: E402
from tests.signing.images import push_image  # noqa: E402
from tests.support.registry import running_registry  # noqa: E402

from kernelbake import __version__  # noqa: E402
from kernelbake.oci import RegistryClient  # noqa: E402
from kernelbake.settings import Settings  # noqa: E402
from kernelbake.signing._internal.keyless import load_trust_config  # noqa: E402
from kernelbake.signing.keys import generate_key_pair, load_private_key  # noqa: E402
from kernelbake.signing.policy import VerifyPolicy  # noqa: E402
from kernelbake.signing.sign import sign_image  # noqa: E402
from kernelbake.signing.signer import KeylessSigner, KeySigner  # noqa: E402
from kernelbake.signing.verify import verify_image  # noqa: E402

RESULTS = REPO / "bench/results/verify_latency.json"


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pct(p: float) -> float:
        # Nearest-rank: the smallest sample with at least p% of samples at or below it.
        k = max(0, min(len(ordered) - 1, int(-(-p * len(ordered) // 100)) - 1))
        return round(ordered[k] * 1000, 2)

    return {
        "n": len(ordered),
        "p50_ms": pct(50),
        "p99_ms": pct(99),
        "min_ms": round(ordered[0] * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 2),
    }


def cold(image: str, policy: Path, n: int, env: dict[str, str]) -> dict[str, float]:
    exe = shutil.which("kernelbake", path=str(Path(sys.executable).parent)) or "kernelbake"
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        result = subprocess.run(
            [exe, "verify", image, "--policy", str(policy)], capture_output=True, text=True, env=env
        )
        samples.append(time.perf_counter() - t0)
        if result.returncode != 0:
            raise SystemExit(f"verify failed during the benchmark: {result.stderr.strip()}")
    return percentiles(samples)


def warm(image: str, policy: VerifyPolicy, n: int, settings: Settings) -> dict[str, float]:
    client = RegistryClient(settings)
    verify_image(image, policy, client=client)  # connection, referrers-API probe, trusted root load
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        verify_image(image, policy, client=client)
        samples.append(time.perf_counter() - t0)
    return percentiles(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", type=int, default=40, help="fresh-process runs per image (default 40)")
    parser.add_argument("--warm", type=int, default=300, help="in-process runs per image (default 300)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kb-bench-"))
    settings = Settings(docker_config=work / "docker-config")
    env = {**os.environ, "DOCKER_CONFIG": str(work / "docker-config")}
    results: dict[str, Any] = {}
    with running_registry(work / "registry") as addr:
        client = RegistryClient(settings)

        _, pub = generate_key_pair(work / "keys")
        key_image = push_image(client, f"{addr}/bench/key-signed:v1", work / "img-key", salt="key")
        sign_image(
            key_image.tagged,
            KeySigner(load_private_key(work / "keys/kernelbake.key")),
            client=client,
            legacy=True,
        )
        key_policy_file = work / "key-policy.yaml"
        key_policy_file.write_text(f"verify:\n  keys: [{pub}]\n")
        key_policy = VerifyPolicy.from_mapping({"keys": [str(pub)]}, source="bench")

        with mock_sigstore(work / "sigstore") as server:
            keyless_image = push_image(
                client, f"{addr}/bench/keyless:v1", work / "img-keyless", salt="keyless"
            )
            signer = KeylessSigner(load_trust_config(str(server.trust_config)), make_token())
            sign_image(keyless_image.tagged, signer, client=client, legacy=True)
        # Verification is offline: the Sigstore server is stopped from here on.
        identity = {"issuer": ISSUER, "subject": SUBJECT}
        keyless_policy_file = work / "keyless-policy.yaml"
        keyless_policy_file.write_text(
            json.dumps({"verify": {"identities": [identity], "trusted_root": str(server.trusted_root)}})
        )
        keyless_policy = VerifyPolicy.from_mapping(
            {"identities": [identity], "trusted_root": str(server.trusted_root)}, source="bench"
        )

        for name, image, policy, policy_file in (
            ("key", key_image.tagged, key_policy, key_policy_file),
            ("keyless", keyless_image.tagged, keyless_policy, keyless_policy_file),
        ):
            results[name] = {
                "image": image,
                "first_call": cold(image, policy_file, args.cold, env),
                "repeated": warm(image, policy, args.warm, settings),
            }

    doc = {
        "benchmark": "verify_latency",
        "what": "kernelbake verify IMAGE --policy (signature + kernelbake attestation + cache manifest) "
        "against Debian docker-registry 2.8 on 127.0.0.1 (no referrers API: fallback tag), "
        "image carrying bundle referrers and legacy .sig/.att tags",
        "first_call": "fresh `kernelbake verify` process per call (interpreter, imports, connection)",
        "repeated": "verify_image in one process, one RegistryClient, after one warm-up call",
        "kernelbake": __version__,
        "python": platform.python_version(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
