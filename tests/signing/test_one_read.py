"""``sign``, ``verify`` and ``inspect`` of a tag read the tag once: the manifest that decided
"one image, not a GPU index" is the one signed, verified or shown. A second read could find
the tag moved in between (and costs a round trip to the registry)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kernelbake.cli import main
from kernelbake.oci import RegistryClient
from kernelbake.remote import top_manifest
from tests.signing.conftest import ImageFactory

pytestmark = pytest.mark.registry


@pytest.fixture
def tag_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths of every manifest GET by tag (not by digest) any RegistryClient makes."""
    seen: list[str] = []
    real = RegistryClient._request

    def recording(self: RegistryClient, method: str, ref: Any, path: str, **kw: Any) -> Any:
        if method == "GET" and path.startswith("manifests/") and ":" not in path:
            seen.append(path)
        return real(self, method, ref, path, **kw)

    monkeypatch.setattr(RegistryClient, "_request", recording)
    return seen


@pytest.fixture
def key_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Path:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    monkeypatch.delenv("KERNELBAKE_SIGNING_KEY_PASSWORD", raising=False)
    monkeypatch.delenv("COSIGN_PASSWORD", raising=False)
    assert main(["generate-key-pair", "--dir", str(tmp_path / "k")]) == 0
    capsys.readouterr()
    return tmp_path / "k"


def test_sign_verify_and_inspect_read_the_tag_once(
    make_image: ImageFactory, key_dir: Path, tag_reads: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    image = make_image()
    tag = f"manifests/{image.ref.tag}"

    assert main(["sign", "--key", str(key_dir / "kernelbake.key"), image.tagged]) == 0
    assert capsys.readouterr().out.startswith(f"signed and attested {image.pinned}")
    assert tag_reads.count(tag) == 1, tag_reads
    tag_reads.clear()

    assert main(["verify", image.tagged, "--key", str(key_dir / "kernelbake.pub")]) == 0
    assert capsys.readouterr().out.startswith(f"verified {image.pinned}")
    assert tag_reads.count(tag) == 1, tag_reads
    tag_reads.clear()

    assert main(["inspect", image.tagged]) == 0
    assert f"{image.digest}" in capsys.readouterr().out
    assert tag_reads.count(tag) == 1, tag_reads


def test_tag_and_digest_still_checks_the_tag(
    make_image: ImageFactory, key_dir: Path, tag_reads: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # repo:tag@digest: the manifest is read by digest, and the tag once to see it has not moved.
    image = make_image()
    assert main(["sign", "--key", str(key_dir / "kernelbake.key"), image.tagged]) == 0
    tag_reads.clear()
    both = f"{image.tagged}@{image.digest}"
    assert main(["verify", both, "--key", str(key_dir / "kernelbake.pub")]) == 0
    assert tag_reads.count(f"manifests/{image.ref.tag}") == 1, tag_reads


def test_a_manifest_passed_for_another_digest_is_refused(
    make_image: ImageFactory, client: RegistryClient
) -> None:
    one, other = make_image(), make_image()
    top = client.get_manifest(other.ref)
    assert top.digest != one.digest
    with pytest.raises(ValueError, match=other.digest):
        top_manifest(client, one.ref.with_digest(one.digest), top)
    assert top_manifest(client, one.ref.with_digest(one.digest), None).digest == one.digest
