"""The bake file kernelbake writes: one group of bake targets per build target. Pure.

Per build target ``<spec>-<gpu>`` (single mode):
    ``<name>-runtime``  stage runtime, output cacheonly
    ``<name>-compile``  stage compile, output cacheonly
    ``<name>``          stage final, tagged, loaded (or pushed by a container builder)
Two-phase mode: ``<name>-runtime`` is loaded as the compile-env image that ``docker run``
uses, and ``<name>`` takes the compiled directory as the named build context ``caches``.
``kernelbake.bake.stages`` runs the bake targets one at a time, so a failure names its stage.

With a cache artifact (``--publish cache|both``), single mode also exports the ``caches``
stage (``<name>-caches``, to ``<build>/<name>/caches``) and, once the caches exist,
``kernelbake.publish.artifact`` writes ``<build>/<name>/artifact-bake.json`` with
``<name>-cache-artifact``: the ``cache-artifact`` stage built from that directory, with the
labels only known then.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.plan import BuildTarget
from kernelbake.render import BuildMode, Rendered

HF_TOKEN_SECRET = "id=hf_token,env=HF_TOKEN"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one target's files live: ``<build>/<name>/{context,caches,logs}``."""

    root: Path

    @property
    def context(self) -> Path:
        return self.root / "context"

    @property
    def caches(self) -> Path:
        return self.root / "caches"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def metadata(self) -> Path:
        return self.root / "metadata.json"

    @property
    def artifact_bake(self) -> Path:
        return self.root / "artifact-bake.json"

    @property
    def artifact_metadata(self) -> Path:
        return self.root / "artifact-metadata.json"


def compile_env_ref(target: BuildTarget) -> str:
    """Local tag of the two-phase compile-env image (never pushed)."""
    return f"kernelbake-compile-env/{target.spec.name}:{target.tag}"


def step_names(rendered: Rendered, *, cache_artifact: bool = False) -> list[tuple[str, str]]:
    """(stage, bake target) in the order ``kernelbake.bake.stages`` runs them."""
    n = rendered.target.name
    if rendered.mode is BuildMode.TWO_PHASE:
        return [("runtime", f"{n}-runtime"), ("final", n)]
    export = [("caches", f"{n}-caches")] if cache_artifact else []
    return [("runtime", f"{n}-runtime"), ("compile", f"{n}-compile"), ("final", n), *export]


def artifact_target_name(rendered: Rendered) -> str:
    return f"{rendered.target.name}-cache-artifact"


def artifact_document(
    rendered: Rendered, layout: Layout, *, ref: str, labels: Mapping[str, str], push: bool
) -> dict[str, Any]:
    """The bake file of one target's cache artifact: its caches directory as the ``caches``
    context (what was compiled, in either mode), and the labels read from it."""
    name = artifact_target_name(rendered)
    target = {
        "context": str(layout.context),
        "dockerfile": "Dockerfile",
        "target": "cache-artifact",
        "contexts": {"caches": str(layout.caches)},
        "labels": dict(sorted(labels.items())),
        "tags": [ref],
        "output": ["type=image,push=true" if push else "type=docker"],
    }
    return {"group": {"default": {"targets": [name]}}, "target": {name: target}}


def bake_targets(
    rendered: Rendered,
    layout: Layout,
    *,
    push: bool,
    secrets: Sequence[str] = (),
    cache_artifact: bool = False,
) -> dict[str, dict[str, Any]]:
    target = rendered.target
    common: dict[str, Any] = {"context": str(layout.context), "dockerfile": "Dockerfile"}
    if secrets:
        common["secret"] = list(secrets)
    final: dict[str, Any] = {
        **common,
        "target": "final",
        "tags": [target.ref],
        "output": ["type=image,push=true" if push else "type=docker"],
    }
    n = target.name
    if rendered.mode is BuildMode.TWO_PHASE:
        return {
            f"{n}-runtime": {
                **common,
                "target": "runtime",
                "tags": [compile_env_ref(target)],
                "output": ["type=docker"],
            },
            n: {**final, "contexts": {"caches": str(layout.caches)}},
        }
    targets = {
        f"{n}-runtime": {**common, "target": "runtime", "output": ["type=cacheonly"]},
        f"{n}-compile": {**common, "target": "compile", "output": ["type=cacheonly"]},
        n: final,
    }
    if cache_artifact:
        # What compile wrote, as files: the artifact is built from them and labelled with
        # their manifest's digest.
        targets[f"{n}-caches"] = {
            **common,
            "target": "caches",
            "output": [f"type=local,dest={layout.caches}"],
        }
    return targets


def bake_document(targets: Mapping[str, Mapping[str, dict[str, Any]]]) -> dict[str, Any]:
    """``targets``: build-target name → its bake targets. The default group holds the finals."""
    merged: dict[str, dict[str, Any]] = {}
    for group in targets.values():
        merged.update(group)
    return {"group": {"default": {"targets": list(targets)}}, "target": merged}


def dumps(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"
