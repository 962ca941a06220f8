"""The registry client against real docker-registry instances: auth, referrers, integrity."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kernelbake.oci import (
    RegistryClient,
    RegistryDenied,
    RegistryNotFound,
    RegistryProtocolError,
    fallback_tag,
    parse_reference,
)
from kernelbake.oci import types as mt
from kernelbake.settings import Settings
from kernelbake.signing.sign import sign_image
from kernelbake.signing.verify import verify_image
from tests.signing.conftest import ImageFactory, KeyPair
from tests.signing.images import push_image
from tests.support.authreg import USER, basic_auth_registry, token_auth_registry, write_docker_config
from tests.support.faults import Reply, fault_proxy

pytestmark = pytest.mark.registry


def _client(docker_config: Path) -> RegistryClient:
    return RegistryClient(Settings(docker_config=docker_config))


def test_basic_auth_from_docker_config(tmp_path: Path, keys: KeyPair) -> None:
    with basic_auth_registry(tmp_path / "reg") as addr:
        anonymous = _client(tmp_path / "empty")
        anonymous.ping(parse_reference(f"{addr}/kb/x:v1"))  # a 401 is an answer: the registry is there
        with pytest.raises(RegistryDenied, match="run docker login"):
            anonymous.get_manifest(parse_reference(f"{addr}/kb/x:v1"))
        client = _client(write_docker_config(tmp_path / "docker", addr))
        image = push_image(client, f"{addr}/kb/basic:v1", tmp_path / "img")
        sign_image(image.tagged, keys.signer, client=client, legacy=True)
        assert verify_image(image.tagged, keys.policy(), client=client).digest == image.digest


def test_bearer_token_auth(tmp_path: Path, keys: KeyPair) -> None:
    with token_auth_registry(tmp_path / "reg") as (addr, issuer):
        client = _client(write_docker_config(tmp_path / "docker", addr))
        image = push_image(client, f"{addr}/kb/bearer:v1", tmp_path / "img")
        sign_image(image.tagged, keys.signer, client=client)
        assert verify_image(image.tagged, keys.policy(), client=client).key == image.key
        assert issuer.issued >= 2  # pull,push scope for writing; tokens were actually used
        with pytest.raises(RegistryDenied, match="refused"):
            _client(tmp_path / "nobody").get_manifest(image.ref)


def test_credential_helper(tmp_path: Path, keys: KeyPair, monkeypatch: pytest.MonkeyPatch) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    helper = bindir / "docker-credential-kbtest"
    helper.write_text(
        "#!/bin/sh\nread host\n"
        f'[ "$1" = get ] && echo \'{{"ServerURL":"\'$host\'","Username":"{USER}","Secret":"s3cret"}}\'\n'
    )
    helper.chmod(helper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    with basic_auth_registry(tmp_path / "reg") as addr:
        client = _client(write_docker_config(tmp_path / "docker", addr, helper="kbtest"))
        image = push_image(client, f"{addr}/kb/helper:v1", tmp_path / "img")
        assert client.resolve(image.ref) == image.digest


def test_referrers_api_is_used_when_the_registry_has_one(
    registry: str, make_image: ImageFactory, client: RegistryClient, keys: KeyPair, tmp_path: Path
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client)
    ref = image.ref.with_digest(image.digest)
    listed = client.referrers(ref)
    index = mt.encode_json(
        {"schemaVersion": 2, "mediaType": mt.OCI_INDEX, "manifests": [d.to_json() for d in listed]}
    )
    seen: list[str] = []

    def rule(method: str, path: str) -> Reply | None:
        seen.append(path)
        if "/referrers/" in path:
            return Reply(200, index, {"Content-Type": mt.OCI_INDEX})
        if path.endswith(f"/manifests/{fallback_tag(image.digest)}"):
            return Reply(500)  # must not be needed
        return None

    with fault_proxy(registry, rule) as proxy:
        proxied = RegistryClient(client.settings)
        via = parse_reference(f"{proxy}/{image.ref.repository}").with_digest(image.digest)
        assert [d.digest for d in proxied.referrers(via)] == [d.digest for d in listed]
        assert (
            verify_image(f"{proxy}/{image.ref.repository}:v1", keys.policy(), client=proxied).digest
            == image.digest
        )
    assert any("/referrers/" in p for p in seen)


def test_registry_that_indexes_subjects_gets_no_fallback_tag(
    registry: str, make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()

    def edit(method: str, path: str, body: bytes) -> tuple[dict[str, str], bytes]:
        # OCI 1.1: a registry that processed the subject says so in OCI-Subject.
        return (
            {"OCI-Subject": image.digest} if method == "PUT" and "/manifests/sha256:" in path else {}
        ), body

    with fault_proxy(registry, lambda m, p: None, edit) as proxy:
        proxied = RegistryClient(client.settings)
        sign_image(f"{proxy}/{image.ref.repository}:v1", keys.signer, client=proxied)
    with pytest.raises(RegistryNotFound):
        client.get_manifest(image.ref.with_tag(fallback_tag(image.digest)))


def test_content_that_does_not_match_its_digest_is_refused(
    registry: str, make_image: ImageFactory, client: RegistryClient
) -> None:
    image = make_image()
    manifest = client.get_manifest(image.ref.with_digest(image.digest))
    config = manifest.config.digest

    def edit(method: str, path: str, body: bytes) -> tuple[dict[str, str], bytes]:
        if path.endswith(config) or path.endswith(image.digest):
            return {}, body.replace(b"amd64", b"arm64").replace(b'"schemaVersion":2', b'"schemaVersion": 2')
        return {}, body

    with fault_proxy(registry, lambda m, p: None, edit) as proxy:
        proxied = RegistryClient(client.settings)
        ref = parse_reference(f"{proxy}/{image.ref.repository}:v1")
        with pytest.raises(RegistryProtocolError, match="digest"):
            proxied.get_blob(ref, config)
        with pytest.raises(RegistryProtocolError, match="digest"):
            proxied.get_manifest(ref.with_digest(image.digest))


def test_blob_size_limit(make_image: ImageFactory, client: RegistryClient) -> None:
    image = make_image()
    layer = client.get_manifest(image.ref.with_digest(image.digest)).layers[0]
    with pytest.raises(RegistryProtocolError, match="limit"):
        client.get_blob(image.ref, layer.digest, max_bytes=16)


def test_digest_addressed_content_is_cached_tags_are_not(
    registry: str, make_image: ImageFactory, client: RegistryClient, keys: KeyPair
) -> None:
    image = make_image()
    sign_image(image.tagged, keys.signer, client=client, legacy=True)
    paths: list[str] = []

    def record(method: str, path: str) -> None:
        paths.append(path)
        return None

    with fault_proxy(registry, record) as proxy:
        proxied = RegistryClient(client.settings)
        ref = f"{proxy}/{image.ref.repository}:v1"
        verify_image(ref, keys.policy(), client=proxied)
        first = list(paths)
        paths.clear()
        verify_image(ref, keys.policy(), client=proxied)
    # Again: the tag, the fallback index and the legacy tags are asked afresh (signatures may
    # have been added or removed); nothing named by a digest is fetched twice.
    assert sorted(p.rsplit("/", 1)[-1] for p in paths) == sorted(
        [
            "v1",
            fallback_tag(image.digest),
            fallback_tag(image.digest) + ".sig",
            fallback_tag(image.digest) + ".att",
        ]
    )
    assert len(first) > len(paths)
    assert not any("/blobs/" in p for p in paths)
