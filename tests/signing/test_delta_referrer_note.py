"""`verify`'s note on what it passed over names kernelbake's own cache delta as that (a referrer
of the image it is layered on, checked by `capture verify`), not as "not a Sigstore bundle"."""

from __future__ import annotations

from kernelbake.contract.delta import ARTIFACT_TYPE as DELTA
from kernelbake.oci import Descriptor
from kernelbake.oci import types as mt
from kernelbake.signing import discover


def _listed(artifact_type: str) -> Descriptor:
    return Descriptor(
        media_type=mt.OCI_MANIFEST, digest="sha256:" + "a" * 64, size=700, artifact_type=artifact_type
    )


def test_a_delta_referrer_is_named_as_kernelbakes_cache_delta() -> None:
    category, reason = discover._listing_problem(_listed(DELTA)) or ("", "")
    assert category == "cache-delta"
    assert reason == "kernelbake's cache delta for this image (kernelbake capture verify checks it)"
    assert "Sigstore" not in reason


def test_another_artifact_type_is_still_not_a_bundle() -> None:
    sbom = "application/vnd.example.sbom.v1+json"
    assert discover._listing_problem(_listed(sbom)) == (
        "artifact-type",
        f"not a Sigstore bundle (artifactType '{sbom}')",
    )
