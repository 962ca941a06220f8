"""The environment inside an image, read in one place (``RuntimeEnv.from_env``).

The host has ``kernelbake.settings``; code in the image never reads ``os.environ`` elsewhere.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from pathlib import Path

from kernelbake.contract.artifact import MANIFEST_DIGEST_ENV
from kernelbake.contract.delta import DELTA_DIGEST_ENV, DELTA_ROOT
from kernelbake.contract.envvars import DeclaredEnv, Variable
from kernelbake.contract.layout import (
    PINNED_MANIFEST,
    PINNED_MANIFEST_NAME,
    RETIRED_TARGET_ENV,
    TARGET_FILE,
    UNSAFE_TARGET_ENV,
)
from kernelbake.contract.manifest import DIGEST
from kernelbake.contract.snapshot import CRIU_COMMAND, IMAGE_DIGEST_ENV, SNAPSHOT_DIGEST_ENV, SNAPSHOT_ROOT
from kernelbake.errors import BadInput

# Where BuildKit mounts ``--mount=type=secret,id=hf_token`` in the model-fetch step.
HF_TOKEN_SECRET = Path("/run/secrets/hf_token")


class CacheMode(enum.Enum):
    # Use the baked caches when the preflight finds them valid.
    ON = "on"
    # Start cold on purpose (benchmarks, debugging): the baked caches are never touched.
    OFF = "off"


class VerifyMode(enum.Enum):
    # Hash every file against the manifest (the default): a flipped byte in a compiled kernel
    # is caught before the engine can load it.
    SHA256 = "sha256"
    # Sizes only. Layer digests are checked at pull, but not what is mounted over the cache
    # root or changed on a writable volume afterwards: a same-size edit passes, and the
    # engine then loads it.
    UNSAFE_SIZE_ONLY = "unsafe-size-only"


# Earlier names: "deep" asked for what is now the default; "size" must be renamed, so that
# the permissive mode is never chosen by a name that does not say it is unsafe.
_VERIFY_ALIASES = {"deep": VerifyMode.SHA256.value}
_VERIFY_RENAMED = {"size": VerifyMode.UNSAFE_SIZE_ONLY.value}

# Set by ``serve`` for an engine it starts while the caches are still being hashed: the
# verdict file the engine waits for before it opens any cache (``runtime.gate``), and the
# pid of the ``serve`` that will write it.
GATE_ENV = "KERNELBAKE_CACHE_GATE"
GATE_OWNER_ENV = "KERNELBAKE_CACHE_GATE_OWNER"
# Set by ``snapshot take`` for the ``serve`` it starts, whose tree it will dump: ``serve``
# starts the engine with its ``snapshot_env`` (``RuntimeEnv.for_snapshot``), and every process
# vLLM starts gives up NVML's device files when take asks (``runtime.nvml``): CRIU cannot dump
# a device file.
SNAPSHOT_TAKE_ENV = "KERNELBAKE_SNAPSHOT_TAKE"
# Where a serving engine notes the batches during which it compiled (``engines.vllm.misses``),
# for ``capture record``: ``serve`` sets it in the engine's environment on a warm start.
MISS_NOTES_ENV = "KERNELBAKE_MISS_NOTES"
MISS_NOTES_NAME = "kernelbake-misses.jsonl"

# The sha256 of the cache manifest, as whoever starts the pod verified it (``runtime.pin``):
# for caches that arrive by volume into an image without a pinned manifest of its own. It can
# only add a requirement: where the image pins a manifest, both must agree. The name is the
# contract's: admission and the stock-vLLM recipes set it (``contract.artifact``).


# Every variable ``RuntimeEnv.from_env`` reads (it can read no other: ``DeclaredEnv``); the CLI
# reference, docs/reference/cli.md, is generated from this table.
VARIABLES = (
    Variable(
        "KERNELBAKE_CACHE",
        "`off`: start cold on purpose (benchmarks, debugging); the baked caches are not touched",
        "on",
    ),
    Variable(
        "KERNELBAKE_VERIFY",
        "`unsafe-size-only`: compare cache file sizes only, not their sha256 (warns at every start; a same-size change is loaded)",
        "sha256",
    ),
    Variable(
        "KERNELBAKE_SCRATCH",
        "writable folder for cold-start caches and, when the cache root is not writable, a copy of the caches (`/tmp` when `TMPDIR` is unset too)",
        "$TMPDIR",
    ),
    Variable("TMPDIR", "the scratch folder when `KERNELBAKE_SCRATCH` is unset", "/tmp"),
    Variable(
        MANIFEST_DIGEST_ENV,
        "`sha256:…` the cache manifest must have, besides the image's pinned copy (caches that arrive by volume into an image without one)",
    ),
    Variable(
        DELTA_DIGEST_ENV,
        f"`sha256:…` of the cache delta's `delta.json` mounted at `{DELTA_ROOT}`, as admission verified it (signature, key, base digest); without it a mounted delta is not used",
    ),
    Variable(
        SNAPSHOT_DIGEST_ENV,
        f"`sha256:…` of the process snapshot's `snapshot.json` mounted at `{SNAPSHOT_ROOT}`, as admission verified it (signature, subject = the pod's image); without it a mounted snapshot is not restored",
    ),
    Variable(
        IMAGE_DIGEST_ENV,
        "`sha256:…` of the image this container runs, as admission or the recipe pinned it; a snapshot is restored only into the image it was taken from",
    ),
    Variable(
        "KERNELBAKE_SNAPSHOT_MARKS",
        "folder for the marker a failed restore leaves (a volume of the pod, so a restarted container does not try again)",
        "$KERNELBAKE_SCRATCH",
    ),
    Variable(
        "KERNELBAKE_CRIU",
        "the CRIU command that takes and restores snapshots (the image's private prefix)",
        CRIU_COMMAND,
    ),
    Variable(
        "KERNELBAKE_STATUS",
        "where `serve` writes its JSON status (preflight, prediction, evidence)",
        "$KERNELBAKE_SCRATCH/kernelbake-status.json",
    ),
    Variable(
        RETIRED_TARGET_ENV,
        f"no longer read: `serve`, `check` and `seed-cache` exit 2 unless it names `{TARGET_FILE}`, the one place the image's `target.json` is read from",
    ),
    Variable(
        UNSAFE_TARGET_ENV,
        "tests and benchmarks outside an image only: read `target.json` and `pinned-manifest.json` from the folder of the `target.json` it names, with none of the mount and owner checks; every verdict warns `UNSAFE:` and admission denies pods that set it",
    ),
    Variable(
        "HF_TOKEN",
        "hub token for `fetch-model`; when unset, the BuildKit secret `hf_token` is read from "
        f"`{HF_TOKEN_SECRET}` (the build passes `HF_TOKEN` that way)",
    ),
    Variable(
        "KERNELBAKE_BUILDER", "free-form identity of the build host, recorded in the manifest's builder entry"
    ),
    Variable(
        "KERNELBAKE_UNSAFE_TEST_DEVICE",
        "tests only: the device name a CPU build reports in place of its measurement",
    ),
    Variable(
        GATE_ENV,
        "the verdict file an engine started by `serve` waits for before it opens a cache",
        internal=True,
    ),
    Variable(GATE_OWNER_ENV, "pid of the `serve` that writes that verdict", internal=True),
    Variable(
        SNAPSHOT_TAKE_ENV,
        "set by `snapshot take` for the serve it starts: the engine starts as a tree to be dumped",
        internal=True,
    ),
    Variable(
        MISS_NOTES_ENV,
        "where a serving engine notes the request classes of the batches during which it compiled, and `capture record` reads them (a sidecar that records must see the same file)",
        f"$KERNELBAKE_SCRATCH/{MISS_NOTES_NAME}",
    ),
)


# The environment this process was started with, as execve gave it: a list, which may name a
# variable twice where os.environ (a dict) shows one of them.
ENVIRON_BLOCK = Path("/proc/self/environ")


def _environ_block() -> bytes | None:
    """The raw environment block, or None where there is no /proc (outside Linux)."""
    try:
        return ENVIRON_BLOCK.read_bytes()
    except FileNotFoundError:
        return None


def _repeated(block: bytes, names: frozenset[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in block.split(b"\0"):
        name = entry.partition(b"=")[0].decode(errors="replace")
        if name in names:
            counts[name] = counts.get(name, 0) + 1
    return {n: c for n, c in counts.items() if c > 1}


def _unambiguous() -> None:
    """Refuse a start whose environment names one of the runtime's variables more than once:
    Python keeps the first, Kubernetes (and a shell) the last, so whoever checked the pod may
    have judged another value than the one read here."""
    try:
        block = _environ_block()
    except OSError as exc:
        raise BadInput(
            f"{ENVIRON_BLOCK} cannot be read ({exc.strerror}), so whether a variable is set twice is unknown"
        ) from None
    if block is None:
        return
    if repeated := _repeated(block, frozenset(v.name for v in VARIABLES)):
        said = ", ".join(f"${n} {c} times" for n, c in sorted(repeated.items()))
        raise BadInput(
            f"the environment sets {said} ({ENVIRON_BLOCK}): which one counts depends on who reads it; "
            "set each once"
        )


def _enum_value(cls: type[enum.Enum], name: str, raw: str) -> enum.Enum:
    try:
        return cls(raw.lower())
    except ValueError:
        choices = ", ".join(m.value for m in cls)
        raise BadInput(f"${name}={raw!r}: expected one of {choices}") from None


def _digest(raw: str | None, name: str = MANIFEST_DIGEST_ENV) -> str | None:
    if not raw:
        return None
    if not DIGEST.fullmatch(raw):
        raise BadInput(f"${name}={raw!r}: expected sha256: and 64 lowercase hex digits")
    return raw


def _unsafe_target(env: Mapping[str, str]) -> Path | None:
    """Where ``$KERNELBAKE_UNSAFE_TARGET`` moves target.json (and the pinned manifest beside
    it), or None: the image's own files. The retired variable is refused rather than ignored,
    so that a run outside an image that set it is not silently given the image's files."""
    retired = env.get(RETIRED_TARGET_ENV)
    if retired and retired != TARGET_FILE:
        raise BadInput(
            f"${RETIRED_TARGET_ENV}={retired!r} is no longer read: serve trusts target.json and the pinned "
            f"manifest only at their fixed paths in the image ({TARGET_FILE}); outside an image (tests, "
            f"benchmarks) set ${UNSAFE_TARGET_ENV}, which also turns off the checks that the files are the "
            "image's"
        )
    raw = env.get(UNSAFE_TARGET_ENV)
    return Path(raw) if raw else None


def _pid(raw: str | None) -> int | None:
    try:
        return int(raw) if raw else None
    except ValueError:
        raise BadInput(f"${GATE_OWNER_ENV}={raw!r}: expected a process id") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeEnv:
    # serve's root of trust: fixed paths in the image (``layout.TRUSTED_FILES``), which no
    # variable but the one named unsafe moves.
    target_file: Path = Path(TARGET_FILE)
    # The copy of the cache manifest the image pins, beside target.json (outside the cache root).
    pinned_manifest: Path = Path(PINNED_MANIFEST)
    # Both moved by ``$KERNELBAKE_UNSAFE_TARGET`` (tests, benchmarks): not checked to be the
    # image's (``runtime.trusted``), and every verdict says so.
    unsafe_target: bool = False
    cache: CacheMode = CacheMode.ON
    verify: VerifyMode = VerifyMode.SHA256
    # A writable directory for cold-start caches and, failing a writable cache root, a copy.
    scratch: Path = Path("/tmp")
    # Free-form identity of the build host (e.g. set by the builder's CDI spec); recorded in
    # the manifest's builder entry.
    builder: str = ""
    # Test stand-ins for GPU families on CPU builders (the fleet test's CDI devices set it):
    # the device name a CPU build reports. Unsafe: it overrides a measurement.
    unsafe_test_device: str | None = None
    hf_token: str | None = None
    gate: Path | None = None
    gate_owner: int | None = None
    # ``kernelbake serve`` writes its JSON status here (preflight, prediction, evidence).
    status_file: Path | None = None
    # Where the engine notes the batches that compiled while it served (``capture record``).
    miss_notes: Path = Path("/tmp") / MISS_NOTES_NAME
    manifest_digest: str | None = None
    # The cache delta a pod may mount (``runtime.serve.delta``), and the sha256 its delta.json must
    # have; moved beside target.json by ``$KERNELBAKE_UNSAFE_TARGET`` like the trusted files.
    delta_root: Path = Path(DELTA_ROOT)
    delta_digest: str | None = None
    # The process snapshot a pod may mount (``runtime.snapshot``), the sha256 its snapshot.json
    # must have, the image digest it must have been taken from, and where a failed restore
    # leaves its marker.
    snapshot_root: Path = Path(SNAPSHOT_ROOT)
    snapshot_digest: str | None = None
    image_digest: str | None = None
    snapshot_marks: Path = Path("/tmp")
    criu: Path = Path(CRIU_COMMAND)
    # This serve was started by ``snapshot take``: its engine's process tree is to be dumped.
    for_snapshot: bool = False
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RuntimeEnv:
        if environ is None:
            _unambiguous()
        env = DeclaredEnv(os.environ if environ is None else environ, VARIABLES)
        token = env.get("HF_TOKEN") or None
        if token is None and HF_TOKEN_SECRET.is_file():
            token = HF_TOKEN_SECRET.read_text().strip() or None
        cache = _enum_value(CacheMode, "KERNELBAKE_CACHE", env.get("KERNELBAKE_CACHE", "on"))
        raw_verify = env.get("KERNELBAKE_VERIFY", VerifyMode.SHA256.value)
        if raw_verify.lower() in _VERIFY_RENAMED:
            raise BadInput(
                f"$KERNELBAKE_VERIFY={raw_verify!r} is no longer a mode: the size-only check is now "
                f"{_VERIFY_RENAMED[raw_verify.lower()]!r}; leave it unset to verify every file's sha256"
            )
        raw_verify = _VERIFY_ALIASES.get(raw_verify.lower(), raw_verify)
        verify = _enum_value(VerifyMode, "KERNELBAKE_VERIFY", raw_verify)
        assert isinstance(cache, CacheMode) and isinstance(verify, VerifyMode)
        moved = _unsafe_target(env)
        target_file = moved or Path(TARGET_FILE)
        return cls(
            target_file=target_file,
            pinned_manifest=target_file.parent / PINNED_MANIFEST_NAME if moved else Path(PINNED_MANIFEST),
            unsafe_target=moved is not None,
            cache=cache,
            verify=verify,
            scratch=Path(env.get("KERNELBAKE_SCRATCH") or env.get("TMPDIR") or "/tmp"),
            builder=env.get("KERNELBAKE_BUILDER", ""),
            unsafe_test_device=env.get("KERNELBAKE_UNSAFE_TEST_DEVICE") or None,
            hf_token=token,
            gate=Path(env[GATE_ENV]) if env.get(GATE_ENV) else None,
            gate_owner=_pid(env.get(GATE_OWNER_ENV)),
            status_file=Path(
                env.get("KERNELBAKE_STATUS")
                or Path(env.get("KERNELBAKE_SCRATCH") or env.get("TMPDIR") or "/tmp")
                / "kernelbake-status.json"
            ),
            miss_notes=Path(
                env.get(MISS_NOTES_ENV)
                or Path(env.get("KERNELBAKE_SCRATCH") or env.get("TMPDIR") or "/tmp") / MISS_NOTES_NAME
            ),
            manifest_digest=_digest(env.get(MANIFEST_DIGEST_ENV)),
            delta_root=target_file.parent / Path(DELTA_ROOT).name if moved else Path(DELTA_ROOT),
            delta_digest=_digest(env.get(DELTA_DIGEST_ENV), DELTA_DIGEST_ENV),
            snapshot_root=target_file.parent / Path(SNAPSHOT_ROOT).name if moved else Path(SNAPSHOT_ROOT),
            snapshot_digest=_digest(env.get(SNAPSHOT_DIGEST_ENV), SNAPSHOT_DIGEST_ENV),
            image_digest=_digest(env.get(IMAGE_DIGEST_ENV), IMAGE_DIGEST_ENV),
            snapshot_marks=Path(
                env.get("KERNELBAKE_SNAPSHOT_MARKS")
                or env.get("KERNELBAKE_SCRATCH")
                or env.get("TMPDIR")
                or "/tmp"
            ),
            criu=Path(env.get("KERNELBAKE_CRIU") or CRIU_COMMAND),
            for_snapshot=env.get(SNAPSHOT_TAKE_ENV) == "1",
            environ=dict(env),
        )


def apply(variables: Mapping[str, str]) -> None:
    """Set variables in this process before an engine is imported (the compile step runs the
    engine in-process; ``serve`` passes a complete environment to ``exec`` instead)."""
    os.environ.update(variables)
