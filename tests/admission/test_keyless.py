"""Keyless trust end to end: an image signed by ``kernelbake sign --keyless`` against the local
Sigstore (@sigstore/mock), admitted by a policy naming the CI identity, with the Sigstore server
stopped (verification is offline, from the trusted root)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import pytest

from tests.admission import documents, live
from tests.admission.live import client_tls
from tests.signing.conftest import ISSUER, SUBJECT, make_token, mock_sigstore

pytestmark = [pytest.mark.sigstore, pytest.mark.registry]


def review(port: int, certs: Path, doc: dict[str, Any]) -> dict[str, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=client_tls(certs), timeout=30)
    conn.request("POST", "/mutate", body=json.dumps(doc), headers={"Content-Type": "application/json"})
    response: dict[str, Any] = json.loads(conn.getresponse().read())["response"]
    conn.close()
    return response


def test_ci_identity_is_admitted_and_others_are_not(registry: str, certs: Path, tmp_path: Path) -> None:
    image = live.push_target(registry, "kernelbake/keyless", "h100", "h100", tmp_path / "img")
    with mock_sigstore(tmp_path / "sigstore") as sigstore:
        env = {"KERNELBAKE_OIDC_TOKEN": make_token(), "KERNELBAKE_TRUST_CONFIG": str(sigstore.trust_config)}
        live.kernelbake("sign", "--keyless", image.tagged, env=env)
        trusted_root = str(sigstore.trusted_root)
    assert not sigstore.running
    patterns = [f"{registry}/kernelbake/**"]
    ours = {
        "identities": [
            {
                "issuer": ISSUER,
                "subject_regex": r"^https://ci\.kernelbake\.test/acme/images/.+@refs/heads/main$",
            }
        ],
        "trusted_root": trusted_root,
    }
    doc = documents.load("pod-create", image.tagged)
    with live.serving(live.write_policy(tmp_path / "ours.yaml", patterns, ours), certs) as served:
        response = review(served.port, certs, doc)
    assert response["allowed"] is True, response
    assert response["patchType"] == "JSONPatch"
    theirs = {
        "identities": [{"issuer": ISSUER, "subject": SUBJECT.replace("acme", "someone-else")}],
        "trusted_root": trusted_root,
    }
    with live.serving(live.write_policy(tmp_path / "theirs.yaml", patterns, theirs), certs) as served:
        response = review(served.port, certs, doc)
    assert response["allowed"] is False
    assert f"image {image.tagged} was rejected" in response["status"]["message"]
    assert "someone-else" in response["status"]["message"]
