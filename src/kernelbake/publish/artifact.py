"""The cache-only artifact (``REPO:TAG-cache``): the caches a build compiled, as the layers of
an image a stock engine image mounts as an image volume, labelled with the key, the manifest's
digest, the engine image by digest and the engine command the built image's own ``serve`` has.

It is built after the image (its labels are known only then), from the caches directory the
build exported, on the image's lane; its labels are checked against what was recorded before
it is pushed, so that nothing half-built is."""

from __future__ import annotations

import dataclasses

from kernelbake.bake import bakefile
from kernelbake.bake.bakefile import Layout
from kernelbake.bake.docker import Docker
from kernelbake.bake.lanes import Lane
from kernelbake.bake.stages import run_bake, stage_failed
from kernelbake.contract import jsondoc
from kernelbake.contract.artifact import (
    CacheArtifactFacts,
    EngineImage,
    InvalidArtifact,
    artifact_facts,
    artifact_ref,
)
from kernelbake.contract.key import key_from_labels
from kernelbake.contract.layout import MANIFEST
from kernelbake.errors import BadInput, BuildFailed, RegistryError
from kernelbake.plan import BuildTarget
from kernelbake.progress import Progress
from kernelbake.publish.push import push_ref, pushed_by_builder
from kernelbake.render import Rendered, engine_env
from kernelbake.settings import Settings

_NOTHING_PUSHED = "nothing of this target's artifact was pushed"


@dataclasses.dataclass(frozen=True)
class CacheBuilt:
    ref: str  # ``repo:tag-cache``
    pushed: str | None  # ``repo@sha256:…`` once pushed
    facts: CacheArtifactFacts


def publish_artifact(
    lane: Lane,
    rendered: Rendered,
    layout: Layout,
    settings: Settings,
    *,
    push: bool,
    has_buildx: bool,
    progress: Progress,
) -> CacheBuilt:
    """Build (and push) the target's cache-only artifact from the caches the build compiled."""
    target = rendered.target
    facts = _facts(lane, target, layout, settings)
    ref = artifact_ref(target.ref)
    push_from_builder = push and lane.builder is not None
    _build(
        lane, rendered, layout, ref, facts, push=push_from_builder, has_buildx=has_buildx, progress=progress
    )
    if push_from_builder:
        name = bakefile.artifact_target_name(rendered)
        return CacheBuilt(ref, pushed_by_builder(name, layout.artifact_metadata, target.repository), facts)
    _check_labels(lane.docker, target, ref, facts)
    pushed = push_ref(lane, target, ref, layout, progress) if push else None
    return CacheBuilt(ref, pushed, facts)


def _facts(lane: Lane, target: BuildTarget, layout: Layout, settings: Settings) -> CacheArtifactFacts:
    """What the artifact's labels say: the compiled manifest, the engine image and command."""
    from kernelbake.oci.types import sha256_digest

    manifest = layout.caches / MANIFEST
    try:
        data = manifest.read_bytes()
    except OSError:
        raise BuildFailed(
            f"{target.name}: {manifest} is missing after compile; the cache artifact needs it",
            hint=_NOTHING_PUSHED,
        ) from None
    command, launch = _engine_command(lane, target, layout)
    return CacheArtifactFacts(
        engine=engine_image(lane.docker, target.base_image, settings),
        manifest_digest=sha256_digest(data),
        command=tuple(command),
        # The image's own variables win over the launch defaults, as in the image.
        env=tuple(sorted({**launch, **dict(engine_env(target))}.items())),
    )


def _build(
    lane: Lane,
    rendered: Rendered,
    layout: Layout,
    ref: str,
    facts: CacheArtifactFacts,
    *,
    push: bool,
    has_buildx: bool,
    progress: Progress,
) -> None:
    """The artifact's own bake file, and its build (pushed by a container builder when ``push``)."""
    target = rendered.target
    document = bakefile.artifact_document(rendered, layout, ref=ref, labels=facts.labels(), push=push)
    layout.artifact_bake.write_text(bakefile.dumps(document))
    log = layout.logs / "cache-artifact.log"
    progress.stage(target.name, "cache-artifact", str(log))
    if has_buildx:
        name = bakefile.artifact_target_name(rendered)
        res = run_bake(lane, layout.artifact_bake, name, log, layout.artifact_metadata)
    else:
        # Single mode only (no named contexts): the same caches, from the Dockerfile's stage.
        labels = [x for k, v in sorted(facts.labels().items()) for x in ("--label", f"{k}={v}")]
        res = lane.docker(
            "build", "--progress=plain", "--target", "cache-artifact", *labels, "-t", ref,
            "-f", str(layout.context / "Dockerfile"), str(layout.context),
            log=log, env={"DOCKER_BUILDKIT": "1"},
        )  # fmt: skip
    if res.returncode != 0:
        raise stage_failed(target, "cache-artifact", log)


def _check_labels(docker: Docker, target: BuildTarget, ref: str, facts: CacheArtifactFacts) -> None:
    labels_seen = docker.labels(ref)
    try:
        same = key_from_labels(labels_seen) == target.key and artifact_facts(labels_seen, source=ref) == facts
    except (InvalidArtifact, BadInput):
        same = False
    if not same:
        raise BuildFailed(f"{ref}: the artifact's labels differ from what the build recorded; not pushing")


def _engine_command(lane: Lane, target: BuildTarget, layout: Layout) -> tuple[list[str], dict[str, str]]:
    """The engine command and launch variables, as the built image's own ``serve`` has them."""
    log = layout.logs / "engine-command.log"
    res = lane.docker(
        "run", "--rm", "--network", "none", "--entrypoint", "python3", target.ref,
        "-m", "kernelbake", "engine-command",
        capture=True,
    )  # fmt: skip
    log.write_text(res.stdout + res.stderr)
    try:
        doc = jsondoc.loads((res.stdout.strip().splitlines() or ["null"])[-1])
        command, launch = doc["command"], doc["env"]
        if not (isinstance(command, list) and isinstance(launch, dict)):
            raise TypeError("not a list and an object")
    except (ValueError, TypeError, KeyError) as exc:
        raise BuildFailed(
            f"{target.ref}: `kernelbake engine-command` gave no command ({exc}); log: {log}",
            hint=_NOTHING_PUSHED,
        ) from None
    return [str(a) for a in command], {str(k): str(v) for k, v in launch.items()}


def engine_image(docker: Docker, name: str, settings: Settings) -> EngineImage:
    """The image the runtime stage was built on, by digest: the daemon's copy (what a docker-
    driver build used) when it has one, else the registry's. Its config digest is what stays
    the same when the image is pushed elsewhere, so that is what the artifact names first."""
    res = docker("image", "inspect", "--format", "{{json .}}", name, capture=True)
    if res.returncode == 0:
        return _daemon_engine_image(name, res.stdout)
    from kernelbake.oci import RegistryClient, parse_reference
    from kernelbake.remote import image_manifest

    try:
        ref = parse_reference(name)
        client = RegistryClient(settings, timeout=30)
        top = client.get_manifest(ref)
        manifest = image_manifest(client, ref.with_digest(top.digest), top)
    except (RegistryError, BadInput) as exc:
        raise BuildFailed(
            f"{name}: the engine image is neither in the daemon nor readable from its registry ({exc})",
            hint="the cache artifact must name the engine image by digest; pull it first",
        ) from None
    return EngineImage(name=name, config_digest=manifest.config.digest, digest=top.digest)


def _daemon_engine_image(name: str, inspected: str) -> EngineImage:
    """The engine image from ``docker image inspect``'s JSON of it."""
    try:
        doc = jsondoc.loads(inspected)
        config = str(doc["Id"])
        repo = name.rsplit("@", 1)[0]
        repo = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
        digests = [str(d) for d in doc.get("RepoDigests") or []]
    except (ValueError, KeyError, TypeError):
        raise BuildFailed(f"{name}: docker image inspect gave no image id") from None
    # Its own repository's digest first; another one's (the image pushed elsewhere under
    # another name, e.g. a mirror the cluster pulls from) names the same manifest when this
    # daemon pushed both (same layers, compressed once).
    found = sorted(digests, key=lambda d: not d.startswith(f"{repo}@"))
    return EngineImage(name=name, config_digest=config, digest=found[0].rsplit("@", 1)[1] if found else None)
