"""Test images shaped like kernelbake's: labels from ``plan()``, cache files in one layer and the
cache manifest alone in the last layer, pushed blob by blob with our registry client."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import tarfile
from collections.abc import Mapping
from pathlib import Path

from kernelbake.contract.key import CacheKey
from kernelbake.contract.layout import CACHE_MANIFEST_PATH, CacheKind
from kernelbake.oci import Reference, RegistryClient, parse_reference
from kernelbake.oci import types as mt
from kernelbake.oci.types import Descriptor, encode_json, sha256_digest
from kernelbake.plan import BuildTarget, plan
from kernelbake.runtime.bundle import write_manifest
from kernelbake.spec import load_spec
from tests.conftest import REPO

CACHE_ROOT = "opt/kernelbake/cache"


@dataclasses.dataclass(frozen=True)
class PushedImage:
    ref: Reference  # with tag
    digest: str
    key: CacheKey
    labels: Mapping[str, str]
    cache_manifest: bytes

    @property
    def tagged(self) -> str:
        return str(self.ref)

    @property
    def pinned(self) -> str:
        return f"{self.ref.name}@{self.digest}"


def tiny_llama_target() -> BuildTarget:
    return plan(load_spec(REPO / "images/tiny-llama-torch.yaml"), ["cpu"], registry="test")[0]


def _tar(files: Mapping[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs: set[str] = set()
        for name in sorted(files):
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in dirs:
                    dirs.add(d)
                    info = tarfile.TarInfo(d)
                    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                    tar.addfile(info)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    return buf.getvalue()


def push_image(
    client: RegistryClient,
    reference: str,
    workdir: Path,
    *,
    labels: Mapping[str, str] | None = None,
    cache_files: Mapping[str, bytes] | None = None,
    builder: object = "cpu",
    last_layer_extra: Mapping[str, bytes] | None = None,
    last_layer_files: Mapping[str, bytes] | None = None,
    salt: str = "",
    target: BuildTarget | None = None,
    root_dir: str = CACHE_ROOT,
    manifest_path: str = CACHE_MANIFEST_PATH,
) -> PushedImage:
    """Push a kernelbake-shaped image; ``labels``, ``last_layer_extra`` (added to the cache
    manifest) and ``last_layer_files`` (instead of it) let tests break it; ``target`` (a
    ``BuildTarget``, default tiny-llama on cpu) gives the key and labels; ``root_dir`` and
    ``manifest_path`` (both "" and "manifest.json") shape a cache artifact instead."""
    target = target or tiny_llama_target()
    key = target.key
    root = workdir / "cache"
    files = dict(
        cache_files
        or {"inductor/fxgraph/abc": b"compiled kernel " + salt.encode(), "triton/k.cubin": b"\0" * 64}
    )
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    write_manifest(root, key, [CacheKind.INDUCTOR, CacheKind.TRITON], report={"builder": builder})
    manifest_json = (root / "manifest.json").read_bytes()
    cache_layer = _tar({f"{root_dir}/{rel}".lstrip("/"): data for rel, data in files.items()})
    last_files = {manifest_path: manifest_json, **(last_layer_extra or {})}
    last_layer = _tar(last_files if last_layer_files is None else last_layer_files)
    image_labels = dict(target.labels) if labels is None else dict(labels)
    ref = parse_reference(reference)
    layers = []
    for raw in (cache_layer, last_layer):
        gz = gzip.compress(raw, mtime=0)
        client.put_blob(ref, gz)
        layers.append((Descriptor.of(gz, mt.OCI_LAYER_GZIP), sha256_digest(raw)))
    config = encode_json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": image_labels},
            "rootfs": {"type": "layers", "diff_ids": [d for _, d in layers]},
        }
    )
    client.put_blob(ref, config)
    manifest = encode_json(
        {
            "schemaVersion": 2,
            "mediaType": mt.OCI_MANIFEST,
            "config": Descriptor.of(config, mt.OCI_CONFIG).to_json(),
            "layers": [d.to_json() for d, _ in layers],
        }
    )
    pushed = client.put_manifest(ref, manifest, mt.OCI_MANIFEST)
    return PushedImage(ref, pushed.digest, key, image_labels, manifest_json)


def config_labels(client: RegistryClient, image: PushedImage) -> dict[str, str]:
    m = client.get_manifest(image.ref.with_digest(image.digest))
    labels: dict[str, str] = json.loads(client.get_blob(image.ref, m.config.digest))["config"]["Labels"]
    return labels
