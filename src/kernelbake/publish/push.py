"""Pushing a built image: only once its build is complete and its labels carry the planned key.
A container builder pushes the image itself at the end of its bake; its digest is then read
from the bake's metadata file."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kernelbake.bake.bakefile import Layout
from kernelbake.bake.lanes import Lane
from kernelbake.contract import jsondoc
from kernelbake.contract.key import key_from_labels
from kernelbake.errors import BuildFailed, RegistryError
from kernelbake.plan import BuildTarget
from kernelbake.progress import Progress, PushTally
from kernelbake.settings import Settings


def ping_registries(targets: Sequence[BuildTarget], settings: Settings) -> None:
    """Stop before a long build when a registry to push to does not answer."""
    # Host-only (requests): the CLI imports the pipeline, and the CLI also runs inside images.
    from kernelbake.oci import RegistryClient, parse_reference
    from kernelbake.remote import registry_reachable

    client = RegistryClient(settings, timeout=10)
    refs = {ref.registry: ref for ref in (parse_reference(t.ref) for t in targets)}
    for registry, ref in sorted(refs.items()):
        with registry_reachable(registry):
            client.ping(ref)


def publish_image(
    lane: Lane, target: BuildTarget, layout: Layout, progress: Progress, *, push: bool
) -> str | None:
    """The image's pushed ``repo@sha256:…``, or None when not pushing; its labels are checked
    against the planned key either way (unless a container builder pushed it)."""
    if lane.builder is not None and push:
        # A container builder pushed the image itself, at the end of a complete build.
        return pushed_by_builder(target.name, layout.metadata, target.repository)
    labels = lane.docker.labels(target.ref)
    if key_from_labels(labels) != target.key:
        raise BuildFailed(f"{target.ref}: the image's key labels differ from the planned key; not pushing")
    return push_ref(lane, target, target.ref, layout, progress) if push else None


def push_ref(lane: Lane, target: BuildTarget, ref: str, layout: Layout, progress: Progress) -> str:
    """``docker push`` of ``ref`` (the image or its cache artifact); its ``repo@sha256:…``."""
    log = layout.logs / ("push.log" if ref == target.ref else "push-cache-artifact.log")
    progress.stage(target.name, "push", str(log))
    # Its per-layer lines count the layers up, for the line a quiet push gets.
    if lane.docker("push", ref, log=log, on_line=progress.watch(target.name, PushTally())).returncode != 0:
        raise RegistryError(f"{target.name}: push of {ref} failed; log: {log}")
    return lane.docker.repo_digest(ref, target.repository)


def pushed_by_builder(name: str, metadata: Path, repository: str) -> str:
    """What a container builder pushed for bake target ``name``, from its metadata file."""
    try:
        meta = jsondoc.loads(metadata.read_text())
        digest = meta[name]["containerimage.digest"]
    except (OSError, ValueError, KeyError) as exc:
        raise RegistryError(f"{name}: pushed, but {metadata} has no digest ({exc})") from None
    return f"{repository}@{digest}"
