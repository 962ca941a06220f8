"""``kernelbake inspect``: what a pushed image, or a model's GPU-variant index, says about
itself, checked where it can be (its labels against the key they carry, the cache manifest's
key against the labels), as results that serialise themselves (``inspect --json``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from kernelbake.contract.artifact import ArtifactKind, artifact_facts, kind_of
from kernelbake.fleet import FleetIndex
from kernelbake.labels import check_labels
from kernelbake.remote import RemoteImage


@dataclasses.dataclass(frozen=True)
class Inspection:
    image: RemoteImage

    @property
    def consistent(self) -> bool:
        """The labels agree with their key, and the cache manifest was built for it."""
        image = self.image
        key = check_labels(image.labels)
        manifest = image.cache_manifest
        return key.consistent and manifest is not None and manifest.key == key.key

    def to_json(self) -> dict[str, Any]:
        image = self.image
        checked = check_labels(image.labels)
        key = checked.key
        artifact = None
        if kind_of(image.labels) is ArtifactKind.CACHE:
            artifact = artifact_facts(image.labels, source=str(image.ref))
        artifact_labels = artifact.labels() if artifact is not None else {}
        doc: dict[str, Any] = {
            "ref": str(image.ref),
            "digest": image.digest,
            "pullable": f"{image.ref.registry}/{image.ref.repository}@{image.digest}",
            "key": str(key),
            "key_digest": key.digest,
            # From the key's device, never from a label: a relabelled image cannot change it.
            "gpu": checked.gpu.name if checked.gpu is not None else None,
            "labels": dict(sorted(checked.derived.items())),
            "labels_consistent": checked.consistent,
            "label_problems": list(checked.problems),
            # Not derived from the key: nothing checks them; shown apart, never as part of the key.
            "unattested_labels": {k: v for k, v in checked.unattested.items() if k not in artifact_labels},
            # A cache artifact's engine image, manifest digest and engine command: attested.
            "artifact": artifact.to_json() if artifact is not None else None,
            "layers": len(image.layers),
            "cache_manifest": None,
        }
        m = image.cache_manifest
        if m is not None:
            doc["cache_manifest"] = {
                "digest": image.cache_manifest_digest,
                "layer": image.layers[-1],
                "key_matches_labels": m.key == key,
                "files": len(m.files),
                "kinds": m.totals(),
                "builder": dict(m.compile_report).get("builder"),
            }
        return doc


@dataclasses.dataclass(frozen=True)
class IndexListing:
    """A model's GPU-variant index, named by ``reference``: one row per variant."""

    reference: str
    index: FleetIndex

    def rows(self) -> list[dict[str, str]]:
        return [
            {
                "device": v.key.device,
                "arch": v.key.arch,
                "engine": f"{v.key.engine.value} {v.key.engine_version}",
                "key_digest": v.key.digest,
                "digest": v.digest,
                "kind": v.kind.value,
                "platform": "/".join(filter(None, (v.os, v.architecture, v.platform().get("variant")))),
            }
            for v in self.index.variants
        ]

    def to_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "index": self.index.ref.pinned(), "variants": self.rows()}
