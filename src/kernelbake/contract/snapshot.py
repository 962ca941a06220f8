"""The process snapshot: its exact key, and the manifest that names every file of it.

A baked cache tolerates a newer driver; a process image tolerates no difference at all, because
it freezes the user-mode driver's state, the kernel objects the process held and every file it
had mapped. So ``SnapshotKey`` is an exact-match key, separate from ``CacheKey`` (which it
contains), and ``differences`` names every field that is not equal, best first, in the words
``serve`` prints (``driver 580.159.04 recorded, 580.95.05 here``).

On disk (the root of a snapshot, and of the OCI artifact that carries it)::

    <root>/snapshot.json      this manifest (``SNAPSHOT_MANIFEST``): key, tree, every file's sha256
    <root>/images/...         CRIU's image files (``criu dump -D``)

``SnapshotManifest.to_json`` is canonical (sorted keys, one encoding), so the sha256 of
``snapshot.json`` names a snapshot; admission pins it in ``$KERNELBAKE_SNAPSHOT_DIGEST`` after it
has verified the artifact's signature and that it refers to the pod's image.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.contract.canonical import Canonical, wire_fields
from kernelbake.contract.key import CacheKey, parse_key
from kernelbake.contract.manifest import DIGEST, SHA256_HEX, bundle_path_problem
from kernelbake.errors import BadInput

SNAPSHOT_SCHEMA = "ks1"
SCHEMA = 1
SNAPSHOT_MANIFEST = "snapshot.json"
IMAGES_DIR = "images"
# Where a pod mounts the snapshot (an image volume of the snapshot artifact), beside the
# delta and outside the cache root.
SNAPSHOT_ROOT = "/opt/kernelbake/snapshot"
# Where CRIU's private prefix is in an image (a spec's ``snapshot: true`` copies it there; a
# recipe may mount one): ``bin/criu`` runs it through the prefix's own loader.
CRIU_PREFIX = "/opt/kernelbake/criu"
CRIU_COMMAND = f"{CRIU_PREFIX}/bin/criu"
# The sha256 of snapshot.json as admission verified it (signature, subject = the pod's image):
# without it a mounted snapshot is never restored.
SNAPSHOT_DIGEST_ENV = "KERNELBAKE_SNAPSHOT_DIGEST"
# The image digest the pod runs, as admission saw it; the process cannot learn it otherwise.
IMAGE_DIGEST_ENV = "KERNELBAKE_IMAGE_DIGEST"
ARTIFACT_TYPE = "application/vnd.kernelbake.snapshot.v1+json"
# Where the dumped tree's stdout and stderr went: CRIU reopens it by path, at the size it had,
# so the restore puts the snapshot's copy (``ENGINE_LOG_COPY``) back there first.
ENGINE_LOG = "/tmp/kernelbake-snapshot/engine.log"
ENGINE_LOG_COPY = f"{IMAGES_DIR}/engine.log"
# While it exists, the restored engine's /health answers 503 (devguard): a snapshot taken with its
# weights outside is back at /health seconds before its weights are, and a readiness probe on
# /health must not send requests to an engine still asleep or reloading. serve writes it before
# the restore and removes it once the weights are reloaded, or the attempt failed.
RELOADING_MARK = "/tmp/kernelbake-snapshot/reloading"
# The container's /dev/shm is a tmpfs of its own, outside the image, so CRIU reopens the files
# there by path (vLLM's shared-memory message queues between the API server, engine core and
# workers): take copies them, as they were at the dump, and the restore puts them back first.
SHM_DIR = "/dev/shm"
SHM_COPY = f"{IMAGES_DIR}/dev-shm"
# A snapshot taken with its weights beside (``Weights.BESIDE``): the engine's weight memory as
# files, written by the worker extension below at take and read by it after the restore's
# wake-up. Under ``images/`` so that every check of the snapshot's files covers them (CRIU
# reads only the image files it wrote). The extension is vLLM's ``--worker-extension-cls``
# (left out of vLLM's compile hash), and its two methods are what ``/collective_rpc`` calls.
WEIGHTS_COPY = f"{IMAGES_DIR}/weights"
WEIGHTS_EXTENSION = "kernelbake.runtime.engines.vllm.snapshot_weights.SnapshotWeights"
SAVE_WEIGHTS = "kernelbake_save_weights"
LOAD_WEIGHTS = "kernelbake_load_weights"


def under(path: str, folder: str) -> bool:
    """Whether the snapshot-relative ``path`` lies in ``folder`` (``SHM_COPY``, ``WEIGHTS_COPY``)."""
    return path.startswith(folder + "/")


class FileKind(enum.Enum):
    """What a snapshot file holds, by its path: the processes' memory (CRIU's ``pages-*.img``),
    the copy of /dev/shm, the weights beside, or anything else CRIU wrote. The first two are
    what a restore brings back into memory."""

    PAGES = "pages"
    DEV_SHM = "dev_shm"
    WEIGHTS = "weights"
    OTHER = "other"


def file_kind(path: str) -> FileKind:
    if under(path, SHM_COPY):
        return FileKind.DEV_SHM
    if under(path, WEIGHTS_COPY):
        return FileKind.WEIGHTS
    return FileKind.PAGES if path.rsplit("/", 1)[-1].startswith("pages-") else FileKind.OTHER


# The capabilities CRIU 4.2.1 needs to dump and to restore a process tree inside a container,
# measured one by one from none (``--cap-drop ALL``) with Docker 26 and podman 4.3 on kernel 6.18
# with the CPU default image (bench/snapshot_caps.py; bench/results/snapshot_caps.json and
# snapshot_caps_podman.json): take needs SYS_ADMIN (without it CRIU stops at once); the restore
# fails without any of SYS_ADMIN, NET_ADMIN (the network lock's nftables rules, a veth pair),
# SYS_TIME (the restored time namespace's clock offsets), SYS_CHROOT (the restorer changes
# root), and under podman SETGID (CRIU gives root back the supplementary group Docker gave it;
# podman gives none). CHECKPOINT_RESTORE and SYS_PTRACE alone do not get past CRIU's kernel
# probes; with SYS_ADMIN neither is needed. Seccomp must be unconfined (Docker's profile refuses
# PTRACE_O_SUSPEND_SECCOMP). The three that admission grants only for a restore:
RESTORE_CAPABILITIES = frozenset({"SYS_ADMIN", "NET_ADMIN", "SYS_TIME"})
# ... and what every container runtime's default set holds already (Docker's, containerd's,
# CRI-O's, podman's), which a container that drops ALL adds back.
RESTORE_DEFAULT_CAPABILITIES = frozenset({"SYS_CHROOT", "SETGID"})
# The whole set a snapshot is taken and restored with, after ``drop: [ALL]``: the same set on
# both sides whatever the runtime's defaults, so that the processes' capabilities CRIU gives
# back are always ones the restoring container has (the gate checks it).
SNAPSHOT_CAPABILITIES = RESTORE_CAPABILITIES | RESTORE_DEFAULT_CAPABILITIES
# The kernel's capabilities by bit (linux/capability.h, through CHECKPOINT_RESTORE, 40), named
# as ``docker run --cap-add`` and ``RESTORE_CAPABILITIES`` name them; a later bit is ``BIT_<n>``.
CAPABILITIES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
)
CAPABILITY_NAME = re.compile(r"[A-Z_]{1,24}|BIT_[0-9]{1,2}")
MAX_CAPABILITY_BIT = 63


def capability_names(mask: int) -> tuple[str, ...]:
    """The capabilities of a ``/proc/PID/status`` mask (``CapPrm``), sorted by name."""
    bits = (b for b in range(MAX_CAPABILITY_BIT + 1) if mask >> b & 1)
    return tuple(sorted(CAPABILITIES[b] if b < len(CAPABILITIES) else f"BIT_{b}" for b in bits))


# Set per container, pod or node, never by the user's configuration of the engine: left out of
# ``serve_env`` (a restored process keeps the values it was dumped with, and none of these
# reaches the engine's work). The snapshot's own settings, which only the gate reads; the
# variables the kubelet adds for the API server's Service (``enableServiceLinks: false`` drops
# the others, never these); and the GPUs the device plugin handed this container (the key
# holds the GPU model and count; which physical GPU it is differs per replica). And what a
# container runtime sets in every container of its own accord: podman ``container=podman`` and
# ``TERM=xterm``, Docker neither (TERM only with -t), so that a snapshot taken with ``docker run``
# restores under podman (the first restore under podman was refused on TERM, 2026-12-06).
VOLATILE_ENV = frozenset(
    {"HOSTNAME", "HOME", "PWD", "OLDPWD", "SHLVL", "_", "container", "TERM"}
    | {SNAPSHOT_DIGEST_ENV, IMAGE_DIGEST_ENV}
    | {"KERNELBAKE_SNAPSHOT_MARKS", "KERNELBAKE_CRIU", "NVIDIA_VISIBLE_DEVICES"}
)
VOLATILE_PREFIXES = ("KUBERNETES_SERVICE_", "KUBERNETES_PORT")


def is_volatile(name: str) -> bool:
    """Whether ``name`` is left out of the key's environment (``VOLATILE_ENV``)."""
    return name in VOLATILE_ENV or name.startswith(VOLATILE_PREFIXES)


MAX_FILES = 100_000
# A hard resource limit of none (RLIM_INFINITY), as recorded; Linux has 16 limits.
UNLIMITED = -1
MAX_RLIMITS = 32
RLIMIT_NAME = re.compile(r"[A-Z_]{1,16}")
MAX_MANIFEST_BYTES = 32 << 20
_SAFE = "-._~/:+@ ,"


class InvalidSnapshot(BadInput, ValueError):
    """A snapshot key or manifest that does not parse or is unsafe; quotes the input."""


DOCUMENT = jsondoc.Kind("snapshot manifest", (SCHEMA,), MAX_MANIFEST_BYTES, InvalidSnapshot)


class Weights(enum.Enum):
    # The weights are in the process image (the restore needs nothing else).
    INSIDE = "inside"
    # Dumped after vLLM's sleep mode level 2: the restore reloads them after wake-up.
    OUTSIDE = "outside"
    # Dumped after vLLM's sleep mode level 2 too, with the engine's weight memory as it held
    # it (after loading and processing) saved beside the process image (``WEIGHTS_COPY``): the
    # restore copies it back after wake-up, byte for byte, with no loader and no processing.
    BESIDE = "beside"

    @property
    def asleep(self) -> bool:
        """Dumped asleep: the restored engine is woken and its weights put back before it serves."""
        return self is not Weights.INSIDE


@dataclasses.dataclass(frozen=True, kw_only=True)
class SnapshotKey(Canonical):
    """Every fact a restore depends on. Field order is the canonical order (``str(key)``,
    ``as_dict``, ``digest``: ``contract.canonical``) and the order the differences are named in:
    the first is the one a user acts on."""

    PREFIX = SNAPSHOT_SCHEMA
    SAFE = _SAFE

    image: str  # sha256:… of the image manifest the tree ran from
    cache_key: CacheKey
    gpu: str  # device name, memory, SM count, MIG profile; "none" on CPU
    gpu_count: int
    driver: str  # NVIDIA driver (kernel module and libcuda); "none"
    cuda_driver_api: str  # cuDriverGetVersion(); "none"
    kernel: str  # uname -r
    criu: str  # criu --version
    criu_features: str  # what `criu check --all` found missing, sorted; "none"
    cpu: str  # model name
    cpu_flags: str  # /proc/cpuinfo flags, sorted
    serve_args: str  # the engine's argv as JSON
    serve_env: str  # sha256 of the engine's environment (names and values), canonical JSON
    weights: Weights

    def __post_init__(self) -> None:
        if not DIGEST.fullmatch(self.image):
            raise InvalidSnapshot(f"snapshot key field image={self.image!r} must be sha256:<64 hex>")
        if not isinstance(self.cache_key, CacheKey):
            raise InvalidSnapshot(f"snapshot key field cache_key={self.cache_key!r} must be a CacheKey")
        if not isinstance(self.weights, Weights):
            raise InvalidSnapshot(f"snapshot key field weights={self.weights!r} must be a Weights")
        if not isinstance(self.gpu_count, int) or isinstance(self.gpu_count, bool) or self.gpu_count < 0:
            raise InvalidSnapshot(f"snapshot key field gpu_count={self.gpu_count!r} must be >= 0")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "str" and (not isinstance(value, str) or not value or value != value.strip()):
                raise InvalidSnapshot(f"snapshot key field {f.name}={value!r} must be a non-empty string")
        if not DIGEST.fullmatch(self.serve_env):
            raise InvalidSnapshot(f"snapshot key field serve_env={self.serve_env!r} must be sha256:<64 hex>")
        # Flags in one order, so equal sets are equal keys.
        object.__setattr__(self, "cpu_flags", " ".join(sorted(set(self.cpu_flags.split()))))

    def replace(self, **changes: Any) -> SnapshotKey:
        return dataclasses.replace(self, **changes)


def env_digest(env: Mapping[str, str]) -> str:
    """``serve_env``: one digest of the engine's whole environment (a restored process keeps
    the environment it was dumped with, so any change is a difference)."""
    return "sha256:" + hashlib.sha256(json.dumps(dict(env), sort_keys=True).encode()).hexdigest()


def parse_snapshot_key(text: str) -> SnapshotKey:
    """Inverse of ``str(SnapshotKey)``; raises ``InvalidSnapshot`` quoting the input."""
    values = wire_fields(text, prefix=SNAPSHOT_SCHEMA, what="snapshot key", error=InvalidSnapshot)
    order = SnapshotKey.field_order()
    if sorted(values) != sorted(order):
        missing = [n for n in order if n not in values]
        unknown = [n for n in values if n not in order]
        raise InvalidSnapshot(f"snapshot key: missing fields {missing}, unknown fields {unknown}")
    kwargs: dict[str, Any] = dict(values)
    try:
        kwargs["cache_key"] = parse_key(values["cache_key"])
        kwargs["weights"] = Weights(values["weights"])
    except ValueError as exc:
        raise InvalidSnapshot(f"snapshot key: {exc}") from None
    if not values["gpu_count"].isdigit():
        raise InvalidSnapshot(f"snapshot key: gpu_count={values['gpu_count']!r} is not an integer")
    kwargs["gpu_count"] = int(values["gpu_count"])
    return SnapshotKey(**kwargs)


# How each field reads in ``snapshot not used: …``.
_LABEL = {
    "image": "image",
    "cache_key": "cache key",
    "gpu": "GPU",
    "gpu_count": "GPU count",
    "driver": "driver",
    "cuda_driver_api": "CUDA driver API",
    "kernel": "kernel",
    "criu": "CRIU",
    "criu_features": "CRIU check",
    "cpu": "CPU",
    "cpu_flags": "CPU flags",
    "serve_args": "serve args",
    "serve_env": "serve env",
    "weights": "weights",
}


def env_changes(recorded: Mapping[str, str], here: Mapping[str, str], most: int = 8) -> str:
    """The variables two environments differ in, by name only (a value here may be a secret:
    take refuses those, serve's environment is not checked for them): ``FOO set here, not
    recorded; BAR unset here; BAZ another value here``."""
    said = [
        f"{name} {'set here, not recorded' if name not in recorded else 'unset here' if name not in here else 'another value here'}"
        for name in sorted(set(recorded) | set(here))
        if recorded.get(name) != here.get(name)
    ]
    more = f"; {len(said) - most} more" if len(said) > most else ""
    return "; ".join(said[:most]) + more


def differences(
    recorded: SnapshotKey,
    here: SnapshotKey,
    environments: tuple[Mapping[str, str], Mapping[str, str]] | None = None,
) -> Iterator[str]:
    """Every field that differs, in field order, as ``driver 580.159.04 recorded, 580.95.05
    here``; nothing for an exact match. The CacheKey names its own fields, CPU flags the flags,
    and, given the recorded environment and this one, the serve env its variables' names."""
    for name in SnapshotKey.field_order():
        a, b = getattr(recorded, name), getattr(here, name)
        if a == b:
            continue
        if name == "cache_key":
            differ = [f for f in CacheKey.field_order() if getattr(a, f) != getattr(b, f)]
            shown = ", ".join(f"{f} {getattr(a, f)} recorded, {getattr(b, f)} here" for f in differ[:3])
            yield f"cache key {a.short_digest} recorded, {b.short_digest} here ({shown})"
        elif name == "cpu_flags":
            was, now = set(a.split()), set(b.split())
            parts = []
            if gone := sorted(was - now):
                parts.append(f"missing here: {' '.join(gone[:8])}")
            if new := sorted(now - was):
                parts.append(f"new here: {' '.join(new[:8])}")
            yield f"CPU flags differ ({'; '.join(parts)})"
        elif name == "serve_env" and environments is not None:
            yield f"serve env differs ({env_changes(*environments)})"
        else:
            yield f"{_LABEL[name]} {recorded.as_dict()[name]} recorded, {here.as_dict()[name]} here"


def lower_limits(recorded: Mapping[str, int], here: Mapping[str, int]) -> list[str]:
    """Each hard limit that is lower here than the snapshot's tree had (CRIU would have to raise
    it), as ``NOFILE 16384 here, 1048576 recorded``; a limit this machine does not know is one."""

    def said(v: int | None) -> str:
        return "unknown" if v is None else "unlimited" if v == UNLIMITED else str(v)

    lower = []
    for name, want in sorted(recorded.items()):
        have = here.get(name)
        if have is None or (have != UNLIMITED and (want == UNLIMITED or have < want)):
            lower.append(f"{name} {said(have)} here, {said(want)} recorded")
    return lower


@dataclasses.dataclass(frozen=True, kw_only=True)
class SnapshotFile:
    path: str  # relative to the snapshot root, under images/
    size: int
    sha256: str
    # The permission bits a file put back in place must have (CRIU checks them on the /dev/shm
    # files it reopens); None for CRIU's own image files. Tar layers do not keep them.
    mode: int | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"path": self.path, "size": self.size, "sha256": self.sha256}
        if self.mode is not None:
            doc["mode"] = self.mode
        return doc


@dataclasses.dataclass(frozen=True, kw_only=True)
class SnapshotManifest:
    key: SnapshotKey
    files: tuple[SnapshotFile, ...]
    # The dumped tree, root first: pid and command, for messages and the restore's wait.
    tree: tuple[tuple[int, str], ...]
    # The tree's processes whose device state the driver checkpointed (those that held the
    # GPU): the restore gives it back to exactly these. Empty without a GPU.
    gpu_pids: tuple[int, ...] = ()
    # Where the restored tree answers, and how long past the restore it may take.
    health_port: int
    health_path: str
    deadline_s: float
    # Free-form provenance (the attestation carries it signed): timings of the dump.
    taken: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # The environment ``serve_env`` digests, names and values: what admission compares a pod's
    # variables with, before it grants the restore's capabilities (a digest alone cannot say
    # which variable differs). None in a snapshot.json from before it was recorded. No secret
    # is here: take refuses them, and the dumped pages hold these values anyway.
    environment: Mapping[str, str] | None = None
    # The tree root's hard resource limits (``NOFILE``: 1048576; ``UNLIMITED`` for none): CRIU
    # gives every process its limits back, and cannot raise a hard limit above the restoring
    # container's without CAP_SYS_RESOURCE (podman's NOFILE 16384 against Docker's 1048576
    # failed a restore, 2026-12-06). None in a snapshot.json from before they were recorded.
    rlimits: Mapping[str, int] | None = None
    # The permission bits of the container's root directory the tree ran under: CRIU refuses to
    # restore a process whose root has others ("File . has bad mode 040555 (expect 040755)":
    # podman's rootfs is 0555, Docker's 0755). None in a snapshot.json from before.
    root_mode: int | None = None
    # Every capability a process of the tree held (permitted, effective or inheritable), by
    # name: CRIU gives each its own back (capset) and fails ("Unable to restore capabilities")
    # on one outside the restoring container's set, as under podman, whose default set lacks
    # Docker's AUDIT_WRITE, MKNOD and NET_RAW (2026-12-06). None in a snapshot.json from before.
    capabilities: tuple[str, ...] | None = None
    # The GPU memory the tree held awake and warmed up, beyond what the device used before it
    # started (NVML's used, the largest rise of any GPU): a restore needs that much free, since
    # the driver's restore and vLLM's wake-up allocate it again, and a failed restore marks the
    # node for the snapshot for good, while memory another process holds is often transient.
    # None in a snapshot.json from before it was recorded, or taken without a GPU.
    device_bytes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(sorted(self.files, key=lambda f: f.path)))
        if self.rlimits is not None:
            object.__setattr__(self, "rlimits", dict(sorted(self.rlimits.items())))
        if self.capabilities is not None:
            object.__setattr__(self, "capabilities", tuple(sorted(set(self.capabilities))))
        # Seconds and byte counts alike as floats: snapshot.json is written from this and read
        # back into it, and an int written as 3541467168 would come back as 3541467168.0, so the
        # manifest read would no longer be the bytes admission pinned (a GPU run of 2026-12-07).
        object.__setattr__(self, "taken", {k: float(v) for k, v in sorted(self.taken.items())})
        if self.environment is not None:
            object.__setattr__(self, "environment", dict(sorted(self.environment.items())))
            if env_digest(self.environment) != self.key.serve_env:
                raise InvalidSnapshot(
                    "snapshot manifest: its environment does not digest to the key's serve_env"
                )
        _check(self)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        doc = {
            "schema": SCHEMA,
            "key": str(self.key),
            "key_digest": self.key.digest,
            "files": [f.to_json() for f in self.files],
            "bytes": self.total_bytes,
            "tree": [[pid, cmd] for pid, cmd in self.tree],
            "gpu_pids": list(self.gpu_pids),
            "health": {"port": self.health_port, "path": self.health_path, "deadline_s": self.deadline_s},
            "taken": self.taken,
        }
        if self.environment is not None:
            doc["environment"] = self.environment
        if self.rlimits is not None:
            doc["rlimits"] = self.rlimits
        if self.root_mode is not None:
            doc["root_mode"] = self.root_mode
        if self.capabilities is not None:
            doc["capabilities"] = list(self.capabilities)
        if self.device_bytes is not None:
            doc["device_bytes"] = self.device_bytes
        return jsondoc.dumps(doc)

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, data: str | bytes, *, source: str) -> SnapshotManifest:
        return DOCUMENT.read(data, source=source, build=cls._of)

    @classmethod
    def _of(cls, doc: dict[str, Any]) -> SnapshotManifest:
        key = parse_snapshot_key(doc["key"])
        if doc.get("key_digest") != key.digest:
            raise InvalidSnapshot("key_digest is not the digest of its key")
        files = tuple(
            SnapshotFile(
                path=str(f["path"]),
                size=int(f["size"]),
                sha256=str(f["sha256"]),
                mode=int(f["mode"]) if "mode" in f else None,
            )
            for f in doc["files"]
        )
        health = doc["health"]
        environment = doc.get("environment")
        if environment is not None and (
            not isinstance(environment, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in environment.items())
        ):
            raise InvalidSnapshot("environment must map names to string values")
        rlimits = doc.get("rlimits")
        if rlimits is not None and (
            not isinstance(rlimits, dict)
            or len(rlimits) > MAX_RLIMITS
            or not all(
                isinstance(k, str) and RLIMIT_NAME.fullmatch(k) and type(v) is int and v >= UNLIMITED
                for k, v in rlimits.items()
            )
        ):
            raise InvalidSnapshot(
                f"rlimits must map at most {MAX_RLIMITS} names (NOFILE) to hard limits >= -1"
            )
        root_mode = doc.get("root_mode")
        if root_mode is not None and (type(root_mode) is not int or not 0 <= root_mode <= 0o7777):
            raise InvalidSnapshot(f"root_mode {root_mode!r} is not permission bits")
        capabilities = doc.get("capabilities")
        if capabilities is not None and (
            not isinstance(capabilities, list)
            or len(capabilities) > MAX_CAPABILITY_BIT + 1
            or not all(isinstance(c, str) and CAPABILITY_NAME.fullmatch(c) for c in capabilities)
        ):
            raise InvalidSnapshot(
                f"capabilities must list at most {MAX_CAPABILITY_BIT + 1} names (SYS_ADMIN, BIT_41)"
            )
        return cls(
            key=key,
            files=files,
            tree=tuple((int(pid), str(cmd)) for pid, cmd in doc["tree"]),
            gpu_pids=tuple(int(pid) for pid in doc["gpu_pids"]),
            health_port=int(health["port"]),
            health_path=str(health["path"]),
            deadline_s=float(health["deadline_s"]),
            taken={str(k): float(v) for k, v in doc.get("taken", {}).items()},
            environment=environment,
            rlimits=rlimits,
            root_mode=root_mode,
            capabilities=None if capabilities is None else tuple(capabilities),
            device_bytes=_device_bytes(doc.get("device_bytes")),
        )


def _device_bytes(value: object) -> int | None:
    if value is not None and (type(value) is not int or value < 0):
        raise InvalidSnapshot(f"device_bytes {value!r} is not a count of bytes")
    return value


def _check(m: SnapshotManifest) -> None:
    _check_files(m)
    _check_tree(m)


def _check_files(m: SnapshotManifest) -> None:
    if not m.files or len(m.files) > MAX_FILES:
        raise InvalidSnapshot(f"snapshot manifest: {len(m.files)} files; a snapshot has 1 to {MAX_FILES}")
    seen: set[str] = set()
    for f in m.files:
        if (problem := bundle_path_problem(f.path)) is not None or not f.path.startswith(IMAGES_DIR + "/"):
            raise InvalidSnapshot(f"snapshot file {f.path!r}: {problem or 'not under images/'}")
        if f.path in seen:
            raise InvalidSnapshot(f"snapshot file {f.path!r} listed twice")
        seen.add(f.path)
        if f.mode is not None and not 0 <= f.mode <= 0o777:
            raise InvalidSnapshot(f"snapshot file {f.path!r}: mode {f.mode:o} is not permission bits")
        if f.size < 0 or not SHA256_HEX.fullmatch(f.sha256):
            raise InvalidSnapshot(f"snapshot file {f.path!r}: size {f.size}, sha256 {f.sha256!r}")


def _check_tree(m: SnapshotManifest) -> None:
    if not m.tree or any(pid <= 0 for pid, _ in m.tree):
        raise InvalidSnapshot("snapshot manifest: the tree must name its processes, root first")
    tree_pids = [pid for pid, _ in m.tree]
    if len(set(m.gpu_pids)) != len(m.gpu_pids) or not set(m.gpu_pids) <= set(tree_pids):
        raise InvalidSnapshot(
            f"snapshot manifest: gpu_pids {list(m.gpu_pids)} must be distinct pids of its tree {tree_pids}"
        )
    if not 0 < m.health_port < 65536 or not m.health_path.startswith("/"):
        raise InvalidSnapshot(f"snapshot manifest: health {m.health_port} {m.health_path!r}")
    if not 0 < m.deadline_s <= 3600:
        raise InvalidSnapshot(f"snapshot manifest: deadline_s={m.deadline_s} must be in (0, 3600]")
