"""What a pod must agree with to use a cache artifact: the engine image it was compiled in, the
serve arguments its key records, and the variables that point the engine at the caches. Pure
checks for the cache rules (``cache_volume``, ``cache_opt_in``); each returns its denials."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from kernelbake.admission import gpus
from kernelbake.admission.references import InvalidReference, parse_reference
from kernelbake.admission.rules.shape import Denial
from kernelbake.admission.scheduling import Way
from kernelbake.admission.subject import CacheArtifact
from kernelbake.contract.artifact import MANIFEST_DIGEST_ENV, CacheArtifactFacts
from kernelbake.contract.key import CacheKey


@dataclasses.dataclass(frozen=True)
class VerifiedArtifact:
    """A cache artifact as verified: its pinned reference, key and attested facts."""

    pinned: str
    key: CacheKey
    facts: CacheArtifactFacts


def verified_artifact(target: str, artifact: CacheArtifact) -> VerifiedArtifact:
    """``artifact`` as verified under ``target``, named by the digest that verified."""
    name = target.rsplit("@", 1)[0] if "@" in target else target.rsplit(":", 1)[0]
    return VerifiedArtifact(f"{name}@{artifact.digest}", artifact.key, artifact.facts)


def gpu_problems(
    where: str, text: str, key: CacheKey, ways: Sequence[Way], judge: gpus.Judge
) -> tuple[list[Denial], list[str]]:
    """(denials, notes) of the artifact's key against every GPU the pod can land on."""
    verdict = judge(key, ways)
    notes = [f"{where}: {text}: {n}" for n in verdict.notes]
    if verdict.ok:
        return [], notes
    return [
        Denial(
            where,
            f"{text} was baked for {key.device} ({key.arch}) but {'; '.join(verdict.problems)}",
            verdict.hint,
        )
    ], notes


def engine_problems(where: str, image: str, got: VerifiedArtifact) -> list[Denial]:
    """The container must run the engine image the caches were compiled in, by manifest
    digest: the only digest admission can compare without reading that image."""
    engine = got.facts.engine
    if engine.digest is None:
        return [
            Denial(
                where,
                f"{got.pinned} names its engine image {engine.name} by config digest {engine.config_digest} "
                "only (it was built from a local image), so the pod's image cannot be checked against it",
                "build the artifact from an engine image pulled from a registry",
            )
        ]
    try:
        ref = parse_reference(image)
    except InvalidReference as exc:
        return [Denial(where, str(exc))]
    if ref.digest != engine.digest:
        return [
            Denial(
                where,
                f"runs {image}, but the caches of {got.pinned} were compiled in {engine.name}@{engine.digest}",
                "run that image pinned by digest",
            )
        ]
    return []


# The serve flags whose values the key records (by key field), with their short spellings.
_KEY_FLAGS: Mapping[str, tuple[str, ...]] = {
    "dtype": ("--dtype",),
    "max_model_len": ("--max-model-len",),
    "max_num_batched_tokens": ("--max-num-batched-tokens",),
    "tp": ("--tensor-parallel-size", "-tp"),
    "pp": ("--pipeline-parallel-size", "-pp"),
}
# Left out by the pod, these take the engine's default, which is what the key holds when 1.
_DEFAULT_ONE = {"tp", "pp"}


def _flags(argv: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, a in enumerate(argv):
        if not a.startswith("-"):
            continue
        name, eq, value = a.partition("=")
        if not eq:
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("-") else ""
        out[name] = value
    return out


def _model(argv: Sequence[str]) -> str | None:
    flags = _flags(argv)
    if "--model" in flags:
        return flags["--model"]
    if "serve" in argv:
        rest = argv[argv.index("serve") + 1 :]
        return rest[0] if rest and not rest[0].startswith("-") else None
    return None


def args_problems(where: str, container: Mapping[str, Any], got: VerifiedArtifact) -> list[Denial]:
    """The serve arguments the pod gives against the key (and the compilation config against
    the recorded command, which holds the options the build pinned)."""
    argv = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
    if not argv:
        return [
            Denial(
                where,
                f"mounts the caches of {got.pinned} but gives no command or args; vLLM's defaults are not "
                "what the key holds",
            )
        ]
    flags, key = _flags(argv), got.key.as_dict()
    differ: list[str] = []
    model = _model(argv)
    if model != got.key.model_path:
        differ.append(f"model {model!r} (key: {got.key.model_path!r})")
    for field, spellings in _KEY_FLAGS.items():
        value = next((flags[f] for f in spellings if f in flags), None)
        if value is None:
            if not (field in _DEFAULT_ONE and str(key[field]) == "1"):
                differ.append(f"{spellings[0]} not given (key: {key[field]})")
        elif value.lower() != str(key[field]).lower():
            differ.append(f"{spellings[0]} {value} (key: {key[field]})")
    recorded = _flags(got.facts.command).get("--compilation-config")
    if recorded is not None and flags.get("--compilation-config") != recorded:
        differ.append("--compilation-config differs from the command the caches were compiled for")
    if differ:
        return [
            Denial(where, f"its serve arguments do not match the caches of {got.pinned}: {'; '.join(differ)}")
        ]
    return []


def env_problems(where: str, container: Mapping[str, Any], got: VerifiedArtifact) -> list[Denial]:
    """Variables the pod sets itself must have the recorded values (they point the engine at
    the caches and enter its compile hash)."""
    wanted = {**dict(got.facts.env), MANIFEST_DIGEST_ENV: got.facts.manifest_digest}
    differ = [
        f"{e['name']}={e.get('value')!r} (recorded: {wanted[e['name']]!r})"
        for e in container.get("env") or []
        if isinstance(e, dict) and e.get("name") in wanted and e.get("value") != wanted[e["name"]]
    ]
    if differ:
        return [Denial(where, f"sets {', '.join(differ)}, not what the caches of {got.pinned} need")]
    return []
