"""The runtime preflight behind ``kernelbake serve`` and ``kernelbake check``.

Probe the GPU and software, compare with the baked key (reasons, not a bool), verify the
bundle against its manifest, and decide where the engine's caches point:

- everything matches and the cache root is writable: the baked caches, in place;
- it matches but the root is read-only (``--read-only`` without the mount recipe below): a
  writable copy elsewhere, with a loud warning, since caches that embed absolute paths
  (FlashInfer's ninja files) rebuild when moved;
- anything else: a fresh empty directory, so the engine starts cold and never reads a cache
  it was not built for.

Keeping the caches writable at their own path needs no privileges: mount a writable volume
*over* the cache root that starts as a copy of it (``READ_ONLY_RECIPE``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kernelbake.contract.compat import Match, Reason, check
from kernelbake.contract.layout import UNSAFE_TARGET_ENV, kind_dir
from kernelbake.contract.manifest import UNSET, Manifest
from kernelbake.contract.platform import Platform
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput, EnvironmentProblem, KernelbakeError
from kernelbake.runtime import pin
from kernelbake.runtime.bundle import copy_bundle, load_manifest
from kernelbake.runtime.engines import EngineRuntime, get_engine, measure
from kernelbake.runtime.env import MISS_NOTES_ENV, CacheMode, RuntimeEnv, VerifyMode
from kernelbake.runtime.integrity import Check, strangers
from kernelbake.runtime.prediction import Change, Prediction, fallback, unavailable
from kernelbake.runtime.redact import shown
from kernelbake.runtime.serve import delta as cache_delta
from kernelbake.runtime.serve.decision import Decision

READ_ONLY_RECIPE = (
    "keep the cache root writable at its own path: "
    "docker run --read-only -v {root} --tmpfs /tmp:exec --shm-size 2g ... "
    "(an anonymous volume starts as a copy of the image's caches); "
    "Kubernetes: an initContainer running 'python3 -m kernelbake seed-cache /seed' into an emptyDir "
    "mounted at /seed, and the same emptyDir mounted at {root} in the serving container "
    "(see docs/serving.md, 'Read-only root filesystems')"
)
_MAX_LISTED = 5


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    target: TargetConfig
    platform: Platform
    match: Match
    # Warm or cold, with every reason the baked caches are not used.
    decision: Decision
    # Worth a warning, but not a reason to start cold.
    notes: tuple[str, ...]
    manifest_files: int
    cache_root: Path
    env: dict[str, str]
    verify: VerifyMode = VerifyMode.SHA256
    # How the files were checked, once they were ("3 files, sha256 of every file checked in 0.01 s").
    integrity: str = ""
    # Per cache kind: the engine's own verdict (``kernelbake check``, or vLLM's plugin at
    # serve time) or, until then, the fallback from the key.
    prediction: Prediction | None = None
    # A cache delta mounted for this start: merged, or why not (None: there was none).
    delta: cache_delta.DeltaOutcome | None = None

    @property
    def warm(self) -> bool:
        """The baked caches are used (some may still miss: see ``predicted_hit``)."""
        return self.decision.warm

    @property
    def problems(self) -> tuple[str, ...]:
        """Why the baked caches are not used (empty when starting warm)."""
        return self.decision.reasons

    @property
    def predicted_hit(self) -> bool:
        """Nothing compiles at start (``kernelbake check`` exits 0)."""
        return self.warm and (self.prediction is None or self.prediction.hit)

    @property
    def predicted(self) -> str:
        """The outcome level (``prediction.Prediction.predicted``); ``miss`` when cold."""
        if not self.warm:
            return "miss"
        return self.prediction.predicted if self.prediction is not None else "hit"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.decision.start.value,
            "predicted": self.predicted,
            "prediction": self.prediction.to_json() if self.prediction else None,
            "key": str(self.target.key),
            "key_digest": self.target.key.digest,
            "found": self.platform.fields(),
            "match": self.match.summary(),
            "problems": list(self.problems),
            "notes": list(self.notes),
            "manifest_files": self.manifest_files,
            "verify": self.verify.value,
            "integrity": self.integrity,
            "cache_root": str(self.cache_root),
            "delta": self.delta.to_json() if self.delta else None,
        }

    def lines(self) -> list[str]:
        if self.warm:
            head = [
                f"baked caches valid ({self.match.summary()}): {self.integrity}, "
                f"engine caches at {self.cache_root}"
            ]
        else:
            head = [f"WARNING: starting COLD; the baked caches are not used (caches at {self.cache_root}):"]
            head += [f"  - {p}" for p in self.problems]
        tail = self.prediction.lines() if self.prediction else []
        if self.delta is not None:
            head.append(self.delta.line())
        return head + [f"WARNING: {n}" for n in self.notes] + tail


def _usable(paths: Sequence[Path]) -> bool:
    """Writable, and compiled kernels there can be loaded: Docker mounts ``--tmpfs`` noexec,
    and Inductor then can neither load its .so files nor probe the CPU's vector ISA."""
    for p in paths:
        try:
            with tempfile.NamedTemporaryFile(dir=p, prefix=".kernelbake-probe-"):
                pass
            if os.statvfs(p).f_flag & os.ST_NOEXEC:
                return False
        except OSError:
            return False
    return True


def _manifest(
    env: RuntimeEnv, root: Path, target: TargetConfig
) -> tuple[Manifest | None, bytes, tuple[str, ...]]:
    """The baked manifest, and why it cannot be used (unreadable, not the one the image pins,
    or another key's). A manifest that is not the pinned one is not returned: nothing it says
    is trusted. Also its exact bytes, which a copy of the bundle carries."""
    try:
        manifest, data = load_manifest(root)
    except BadInput as exc:
        return None, b"", (str(exc),)
    if problems := pin.problems(env, root, data):
        return None, b"", tuple(problems)
    if manifest.key != target.key:
        why = f"the cache manifest was built for key {manifest.key.digest}, target.json says {target.key.digest}"
        return manifest, data, (why,)
    return manifest, data, ()


def _integrity(
    env: RuntimeEnv, root: Path, target: TargetConfig, merged: frozenset[str]
) -> tuple[Manifest | None, bytes, tuple[str, ...], Check | None]:
    """``merged``: the pinned delta's paths, which a restarted container finds merged by its
    earlier start: the delta's to judge, not strangers (``preflight`` goes cold on them if the
    delta is not used)."""
    manifest, data, problems = _manifest(env, root, target)
    if problems or manifest is None:
        return manifest, data, problems, None
    return manifest, data, (), Check(root, manifest, hash_files=env.verify is VerifyMode.SHA256, delta=merged)


def _known_reasons(
    env: RuntimeEnv, target: TargetConfig, manifest: Manifest | None, manifest_reasons: tuple[str, ...]
) -> tuple[str, ...]:
    """What rules the baked caches out before the probe has run or a file is hashed."""
    off = ["KERNELBAKE_CACHE=off: starting cold on purpose"] if env.cache is CacheMode.OFF else []
    ranks = _rank_problems(manifest if not manifest_reasons else None, target)
    return (*off, *manifest_reasons, *ranks)


def _writable_in_place(baked: Path, engine: EngineRuntime) -> bool:
    return _usable([baked, *(kind_dir(baked, k) for k in engine.declaration.cache_kinds)])


def _integrity_reasons(bad: Sequence[str]) -> tuple[str, ...]:
    problems = [f"cache integrity: {p}" for p in bad[:_MAX_LISTED]]
    if len(bad) > _MAX_LISTED:
        problems.append(f"cache integrity: {len(bad) - _MAX_LISTED} more files differ")
    return tuple(problems)


def _rank_problems(manifest: Manifest | None, target: TargetConfig) -> list[str]:
    """Ranks the serve arguments start (tensor x pipeline parallel size) that the bundle holds
    no caches for: each such worker would compile its shard at start, so the start is not warm.
    A world of one needs no rank entry (bundles of engines without ranks have none)."""
    tp, pp = target.key.tp, target.key.pp
    world = tp * pp
    if manifest is None or (world == 1 and not manifest.ranks):
        return []
    held = manifest.rank_totals()
    missing = [r for r in range(world) if held.get(r, {}).get("files", 0) == 0]
    if not missing:
        return []
    present = [r for r, t in held.items() if t["files"]]
    return [
        f"the bundle holds no caches for rank(s) {', '.join(map(str, missing))} of the {world} that "
        f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} starts "
        f"(it holds rank(s) {', '.join(map(str, present)) or 'none'}); "
        "rebuild the image with this kernelbake at these parallel sizes"
    ]


def _hashed_env_notes(manifest: Manifest | None, effective: dict[str, str]) -> list[str]:
    """Hashed variables whose value differs from the compile step's. The manifest lists every
    variable the engine hashed (unset ones as ``UNSET``), so this needs no engine import."""
    if manifest is None:
        return []
    notes = []
    for name, then in manifest.hashed_env:
        now = effective.get(name, UNSET)
        # Secret-carrying values are recorded as digests (kernelbake.runtime.redact).
        if now != then and shown(name, now) != then:
            shown_now = "unset" if now == UNSET else repr(shown(name, now))
            shown_then = "unset" if then == UNSET else repr(shown(name, then))
            notes.append(
                f"${name} is {shown_now} but was {shown_then} at compile time; the engine hashes it, "
                "so affected graphs compile at startup (unset it or rebuild with it pinned in serve.env)"
            )
    return notes


def _temp_dirs(env: RuntimeEnv) -> list[Path]:
    """Where this process and the engine put temporary files: kernelbake's scratch, and the
    directory Python's ``tempfile`` (torch, vLLM's IPC sockets) picks first."""
    return list(dict.fromkeys([env.scratch, Path(env.environ.get("TMPDIR") or "/tmp")]))


def _writable(paths: Sequence[Path]) -> bool:
    for p in paths:
        try:
            p.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=p, prefix=".kernelbake-probe-"):
                pass
        except OSError:
            return False
    return True


def _need_temp_dir(env: RuntimeEnv, root: Path) -> None:
    """Every start needs a writable temporary directory, warm or cold: without one the engine's
    import fails (``--read-only`` without a tmpfs) with an error that names neither the
    directory nor the recipe."""
    bad = [p for p in _temp_dirs(env) if not _writable([p])]
    if bad:
        raise EnvironmentProblem(
            f"{bad[0]} is not a writable directory, and the engine needs one to start",
            hint=f"{READ_ONLY_RECIPE.format(root=root)}; or point TMPDIR and KERNELBAKE_SCRATCH at "
            "a writable directory that allows executing compiled kernels",
        )


def _fresh_dir(scratch: Path, prefix: str, why: str, root: Path) -> Path:
    with contextlib.suppress(OSError):
        scratch.mkdir(parents=True, exist_ok=True)
    if not _usable([scratch]):
        raise EnvironmentProblem(
            f"{why}, and {scratch} is not a writable directory that allows executing compiled kernels",
            hint=f"{READ_ONLY_RECIPE.format(root=root)}; for cold starts mount {scratch} with exec "
            "(docker run --tmpfs /tmp:exec) or set KERNELBAKE_SCRATCH",
        )
    return Path(tempfile.mkdtemp(prefix=prefix, dir=scratch))


def _engine_env(env: RuntimeEnv, target: TargetConfig, engine: EngineRuntime, root: Path) -> dict[str, str]:
    """What the engine starts with: its launch defaults, then the container's and the image's
    environment, the caches at ``root``, and for a tree ``snapshot take`` dumps, what the
    engine needs for that."""
    cache_env = engine.declaration.cache_env_for(root, target.key)
    snapshot_env = engine.snapshot_env() if env.for_snapshot else {}
    return {**engine.launch_env(), **env.environ, **dict(target.serve.env), **cache_env, **snapshot_env}


def _cold_root(env: RuntimeEnv, baked: Path, engine: EngineRuntime) -> Path:
    root = _fresh_dir(env.scratch, "kernelbake-cold-", "starting cold", baked)
    for kind in engine.declaration.cache_kinds:
        kind_dir(root, kind).mkdir(parents=True, exist_ok=True)
    return root


def _identity(manifest: Manifest | None) -> dict[str, Any] | None:
    found = dict(manifest.compile_report).get("engine_identity") if manifest else None
    return found if isinstance(found, dict) else None


def _device_only(match: Match, identity: dict[str, Any] | None) -> Reason | None:
    """A device-name change on the same architecture, when the engine recorded what it keys
    on: only some caches depend on the name, so the bundle is kept (``fallback`` says which)."""
    blocking = match.blocking
    if identity is None or len(blocking) != 1 or blocking[0].field != "device":
        return None
    return blocking[0]


def _warm_env(
    env: RuntimeEnv,
    target: TargetConfig,
    engine: EngineRuntime,
    root: Path,
    baked: Path,
    asks_engine: bool,
) -> dict[str, str]:
    """The engine's environment for a warm start on the caches at ``root`` (the baked ones, or
    a writable copy); where the build recorded the engine's identity (``asks_engine``), the
    engine is also pointed at the baked manifest to state its own prediction."""
    run_env = _engine_env(env, target, engine, root)
    if asks_engine:
        run_env.update(engine.prediction_env(baked))
    # What compiles after the start is noted for ``capture record``: only a warm start has
    # baked caches for a miss to be a miss of.
    run_env[MISS_NOTES_ENV] = str(env.miss_notes)
    return run_env


@dataclasses.dataclass(frozen=True)
class Speculation:
    """How ``serve`` starts the engine before the preflight has answered: on the baked
    caches in place, behind the cache gate, which opens only if ``preflight`` (run
    meanwhile) ends warm with this very environment."""

    target: TargetConfig
    cache_root: Path
    env: dict[str, str]
    manifest_files: int


def speculate(env: RuntimeEnv, engine: EngineRuntime | None = None) -> Speculation | None:
    """The warm start, from what is known without importing the engine's libraries or
    hashing a file: the probe (torch and CUDA take seconds to load) and the sha256 check then
    run alongside the engine's own imports instead of before them. ``None`` where the start
    cannot be warm in place anyway (caches off, a foreign or unreadable manifest, ranks
    missing, a read-only root): ``serve`` then runs the preflight first, as before."""
    try:
        target = TargetConfig.load(env.target_file)
    except KernelbakeError:
        # The preflight says what is wrong with the input.
        return None
    baked = Path(target.cache_root)
    manifest, _data, manifest_reasons = _manifest(env, baked, target)
    if manifest is None or _known_reasons(env, target, manifest, manifest_reasons):
        return None
    if cache_delta.present(env):
        # The delta is merged before the engine starts, so that what it adds is in the
        # engine's caches (and in the start-up report's "before") from the first file.
        return None
    if not _writable(_temp_dirs(env)):
        # The preflight says which directory, and the recipe.
        return None
    engine = engine or get_engine(target.key.engine)
    if not _writable_in_place(baked, engine):
        return None
    return Speculation(
        target=target,
        cache_root=baked,
        env=_warm_env(env, target, engine, baked, baked, _identity(manifest) is not None),
        manifest_files=len(manifest.files),
    )


class NoteKind(enum.Enum):
    """What a preflight note is about: only a serve-time change makes graphs compile at
    startup, and only such notes become changes in the fallback prediction."""

    SERVE_TIME_CHANGE = "serve-time-change"
    UNSAFE_VERIFY = "unsafe-verify"
    UNSAFE_TARGET = "unsafe-target"
    READ_ONLY_COPY = "read-only-copy"


@dataclasses.dataclass(frozen=True)
class Note:
    """Something the preflight says without starting cold; ``kind`` says what becomes of it."""

    kind: NoteKind
    text: str


def _serve_time_notes(
    env: RuntimeEnv,
    target: TargetConfig,
    engine: EngineRuntime,
    manifest: Manifest | None,
    baked: Path,
    user_args: Sequence[str],
) -> list[Note]:
    """Where the engine does not state its own verdict: the hashed variables and the serve
    arguments that differ from the build's, each of which makes graphs compile at startup."""
    # What the engine will see, its launch defaults included: were one of them hashed,
    # this is where a start that misses the caches would be named.
    effective = _engine_env(env, target, engine, baked)
    texts = _hashed_env_notes(manifest, effective)
    if shape := engine.shape_args(target, user_args):
        texts.append(
            f"serve arguments change what was compiled ({'; '.join(shape)}): "
            "those graphs compile at startup instead of loading from the baked caches"
        )
    return [Note(NoteKind.SERVE_TIME_CHANGE, t) for t in texts]


def _verify_notes(env: RuntimeEnv) -> list[Note]:
    if env.verify is not VerifyMode.UNSAFE_SIZE_ONLY:
        return []
    return [
        Note(
            NoteKind.UNSAFE_VERIFY,
            "UNSAFE: KERNELBAKE_VERIFY=unsafe-size-only compares cache file sizes only; a cache file "
            "changed without changing its size is loaded and run by the engine",
        )
    ]


def _target_notes(env: RuntimeEnv) -> list[Note]:
    if not env.unsafe_target:
        return []
    return [
        Note(
            NoteKind.UNSAFE_TARGET,
            f"UNSAFE: ${UNSAFE_TARGET_ENV} moved target.json and the pinned manifest to {env.target_file.parent}; "
            "nothing checks that they are the image's (mounts, owner), so whoever wrote them there decides "
            "which caches start warm",
        )
    ]


def _await_integrity(pending: Check | None, decision: Decision) -> tuple[Decision, str]:
    """Waits for the sha256 check (cancelled where the caches are ruled out anyway): the
    decision with what differs, and how the files were checked."""
    if pending is None:
        return decision, ""
    if not decision.warm:
        pending.cancel()
        return decision, ""
    return decision.ruled_out(_integrity_reasons(pending.result())), pending.summary()


@dataclasses.dataclass(frozen=True)
class _Placed:
    root: Path
    decision: Decision
    # The read-only copy's warning, where the caches were copied.
    note: Note | None = None


def _place_caches(
    env: RuntimeEnv,
    baked: Path,
    engine: EngineRuntime,
    manifest: Manifest | None,
    data: bytes,
    decision: Decision,
    in_place: bool,
) -> _Placed:
    """Where the engine's caches point: the baked ones in place, a checked copy where the
    root is read-only, or a fresh directory for a cold start (a failed copy is one more
    reason to start cold)."""
    placed = _Placed(baked, decision)
    if decision.warm and not in_place:
        assert manifest is not None  # warm: the manifest was read and pinned
        placed = _copy(env, baked, manifest, data, decision)
    root = placed.root if placed.decision.warm else _cold_root(env, baked, engine)
    for kind in engine.declaration.cache_kinds:
        kind_dir(root, kind).mkdir(parents=True, exist_ok=True)
    return dataclasses.replace(placed, root=root)


def _copy(env: RuntimeEnv, baked: Path, manifest: Manifest, data: bytes, decision: Decision) -> _Placed:
    """A writable copy of the baked caches, for a read-only cache root."""
    root = _fresh_dir(env.scratch, "kernelbake-cache-", f"{baked} is read-only", baked)
    try:
        # Only what the manifest lists, hashed again as it is copied (never a symlink).
        copy_bundle(baked, manifest, data, root)
    except BadInput as exc:
        return _Placed(root, decision.ruled_out(_integrity_reasons([f"while copying: {exc}"])))
    note = Note(
        NoteKind.READ_ONLY_COPY,
        f"{baked} is read-only, so the caches were copied to {root}; caches that embed "
        f"their absolute path rebuild there. To avoid this, {READ_ONLY_RECIPE.format(root=baked)}",
    )
    return _Placed(root, decision, note)


def _fallback_prediction(
    manifest: Manifest | None,
    identity: dict[str, Any] | None,
    device: Reason | None,
    asks_engine: bool,
    notes: Sequence[Note],
) -> Prediction | None:
    """The prediction from the key, for a warm start the engine will not (yet) judge itself."""
    baked_kinds = sorted({f.kind.value for f in manifest.files}) if manifest else []
    if device is not None:
        return fallback(
            baked_kinds,
            [],
            baked_identity=identity,
            device=(device.expected, device.found),
            note="device name differs on the same architecture; the engine's verdict follows at start",
        )
    if asks_engine:
        return None
    changes = [
        Change("serve-time change", "as baked", n.text) for n in notes if n.kind is NoteKind.SERVE_TIME_CHANGE
    ]
    why = (
        "the bundle records no engine identity"
        if identity is None
        else "the engine is asked by kernelbake check"
    )
    return fallback(baked_kinds, changes, note=why)


def preflight(
    env: RuntimeEnv,
    user_args: Sequence[str] = (),
    *,
    engine: EngineRuntime | None = None,
) -> Verdict:
    """The verdict for this machine; waits for the sha256 check (``serve`` runs it in a
    thread while the engine starts behind its cache gate: ``speculate``)."""
    target = TargetConfig.load(env.target_file)
    baked = Path(target.cache_root)
    _need_temp_dir(env, baked)
    # Hashing starts before the probe: the probe imports the engine's libraries (torch
    # takes seconds), and the hashing threads run meanwhile.
    merged = cache_delta.pinned_paths(env)
    manifest, data, manifest_reasons, pending = _integrity(env, baked, target, merged)
    engine = engine or get_engine(target.key.engine)
    platform = measure(engine)
    match = check(target.key, platform)
    identity = _identity(manifest)
    device = _device_only(match, identity)
    decision = Decision.of(
        (
            *(str(r) for r in match.blocking if r is not device),
            *_known_reasons(env, target, manifest, manifest_reasons),
        )
    )
    # The engine states its own verdict as it starts (vLLM's plugin) only where it recorded
    # its identity; otherwise the key, the hashed variables and the engine's flag check.
    asks_engine = identity is not None and bool(engine.prediction_env(baked))
    notes = [] if asks_engine else _serve_time_notes(env, target, engine, manifest, baked, user_args)
    notes += _verify_notes(env)
    in_place = decision.warm and _writable_in_place(baked, engine)
    decision, summary = _await_integrity(pending, decision)
    placed = _place_caches(env, baked, engine, manifest, data, decision, in_place)
    notes += [placed.note] if placed.note else []
    delta = _delta(env, target, engine, manifest, data, placed.decision, placed.root)
    if (
        placed.decision.warm
        and manifest
        and (left := cache_delta.leftovers(placed.root, merged, manifest, delta))
    ):
        cold = placed.decision.ruled_out(_integrity_reasons(left))
        placed = _place_caches(env, baked, engine, manifest, data, cold, in_place)
    notes += _target_notes(env)
    decision, root = placed.decision, placed.root
    prediction = (
        _fallback_prediction(manifest, identity, device, asks_engine, notes) if decision.warm else None
    )
    if decision.warm:
        run_env = _warm_env(env, target, engine, root, baked, asks_engine)
    else:
        run_env = _engine_env(env, target, engine, root)
    return Verdict(
        target=target,
        platform=platform,
        match=match,
        decision=decision,
        notes=tuple(n.text for n in notes),
        manifest_files=len(manifest.files) if manifest else 0,
        cache_root=root,
        env=run_env,
        verify=env.verify,
        integrity=summary,
        prediction=prediction,
        delta=delta,
    )


def _delta(
    env: RuntimeEnv,
    target: TargetConfig,
    engine: EngineRuntime,
    manifest: Manifest | None,
    data: bytes,
    decision: Decision,
    root: Path,
) -> cache_delta.DeltaOutcome | None:
    """The mounted delta merged into ``root``, on a warm start only: a delta is layered on the
    baked caches, so where they are not used neither is it."""
    if not cache_delta.present(env):
        return None
    if not decision.warm or manifest is None:
        return cache_delta.DeltaOutcome(
            where=env.delta_root, used=False, reason="the baked caches are not used, so neither is the delta"
        )
    return cache_delta.apply(env, target, manifest, data, root, set(engine.declaration.cache_kinds))


@dataclasses.dataclass(frozen=True)
class Seeded:
    root: Path
    # Cache files copied (each hashed on the way against the pinned manifest).
    files: int
    # What the cache root held that the manifest does not list: left behind.
    skipped: tuple[str, ...]


def seed(env: RuntimeEnv, dest: Path) -> Seeded:
    """Copy the baked bundle into ``dest`` (an emptyDir in a Kubernetes initContainer) so it
    can be mounted writable at the cache root's own path: the manifest only if it is the one
    the image pins, then every file it lists, hashed as it is copied. Files and symlinks it
    does not list are left behind, and no symlink is followed."""
    root = Path(TargetConfig.load(env.target_file).cache_root)
    try:
        manifest, data = load_manifest(root)
    except BadInput as exc:
        raise BadInput(f"seed-cache: {exc}") from None
    if problems := pin.problems(env, root, data):
        raise BadInput(f"seed-cache: {problems[0]}")
    skipped = tuple(strangers(root, manifest))
    try:
        copied = copy_bundle(root, manifest, data, dest)
    except BadInput as exc:
        raise BadInput(f"seed-cache: copying {root} to {dest}: {exc}") from None
    return Seeded(root, copied, skipped)


def ask_engine(
    engine: EngineRuntime,
    verdict: Verdict,
    user_args: Sequence[str],
    *,
    last_said: Callable[[], str | None] = lambda: None,
) -> Verdict:
    """``kernelbake check``: the verdict with the engine's own prediction, computed by its code
    with the environment ``serve`` gives it. Whatever the engine raises while predicting (vLLM's
    own hash functions on an engine configuration they do not expect, its parser exiting on an
    argument) becomes ``no prediction: <reason>``, which is not a hit: check then exits 6.
    ``last_said``: what the engine last wrote (``engine_output.Heard.rejection``), which is how
    an argument parser that exits says which argument it rejected."""
    if not verdict.warm:
        return verdict
    try:
        asked = engine.predict(verdict.target, user_args, verdict.env)
    except (Exception, SystemExit) as exc:
        why = "the engine did not answer"
        if isinstance(exc, SystemExit):
            said = last_said() if exc.code not in (0, None) else None
            reason = f"the engine's argument parser exited ({exc.code})"
            if said:
                why = "the engine rejected the serve arguments"
                reason = f"{why}: {said}"
        else:
            reason = f"{type(exc).__name__}: {exc}"
        kinds = sorted({k.kind for k in verdict.prediction.kinds}) if verdict.prediction else []
        asked = unavailable(kinds or [k.value for k in engine.declaration.cache_kinds], reason, why=why)
    return verdict if asked is None else dataclasses.replace(verdict, prediction=asked)
