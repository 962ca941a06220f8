"""The snapshot gate in ``serve``, and the one restore it allows.

Before anything is restored, in this order (each refusal prints ``snapshot not used: …`` and
``serve`` does the baked start at once; nothing on the node is changed):

1. a snapshot is mounted (``snapshot.json`` under the snapshot root); none: no line, baked start;
2. admission pinned it: ``$KERNELBAKE_SNAPSHOT_DIGEST`` is set (after the artifact's signature
   and its subject, the pod's image, were verified), and ``snapshot.json`` has that sha256;
3. no marker: a restore of this very snapshot has not failed on this node before;
4. the key is exact: ``$KERNELBAKE_IMAGE_DIGEST`` (the pod's image) and every other field
   measured here equal the recorded ones, each difference named;
5. every GPU here has as much memory free as the engine held when it was taken
   (``device_bytes``, asked of NVML), and the container as much memory as CRIU restores into
   (the processes' pages and /dev/shm's files): a restore that ran out would mark the node;
6. every file under ``images/`` is listed, a plain file, of its size and sha256 (a truncated
   or tampered page file is named), and nothing else is there. The sha256 is skipped only for
   an image volume the container runtime pulled by digest and mounted as a read-only overlay
   of those layers alone, with nothing mounted inside (``volume``): verified once per node,
   when it was pulled, and writable by nothing in the pod.

Then the one attempt: ``criu restore``, the driver's restore of each process, ``/health`` and,
for a snapshot taken with its weights outside, vLLM woken and its weights reloaded from the
model's files, all by the recorded deadline. A restore that fails or misses it is killed, the node is marked for
that snapshot (a file in the marks directory, so a restarted container does not try again),
and the baked start runs: one attempt, never a loop."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from kernelbake.contract.snapshot import (
    ENGINE_LOG,
    ENGINE_LOG_COPY,
    IMAGE_DIGEST_ENV,
    IMAGES_DIR,
    LOAD_WEIGHTS,
    MAX_MANIFEST_BYTES,
    RELOADING_MARK,
    SHM_COPY,
    SHM_DIR,
    SNAPSHOT_CAPABILITIES,
    SNAPSHOT_DIGEST_ENV,
    SNAPSHOT_MANIFEST,
    WEIGHTS_COPY,
    FileKind,
    InvalidSnapshot,
    SnapshotKey,
    SnapshotManifest,
    Weights,
    differences,
    file_kind,
    lower_limits,
    under,
)
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import KernelbakeError
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.snapshot import hashing, http, readahead, tree, volume
from kernelbake.runtime.snapshot.criu import Criu, RestoreTimedOut, failure
from kernelbake.runtime.snapshot.driver import DeviceMemory, Driver
from kernelbake.runtime.snapshot.machine import (
    grantable_capabilities,
    hard_rlimits,
    here_key,
    may_raise_rlimits,
    memory_room,
    serve_env,
)

_PR_SET_CHILD_SUBREAPER = 36
Say = Callable[[str], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gated:
    """The gate's answer: a manifest to restore, or the reasons not to (best first)."""

    manifest: SnapshotManifest | None
    digest: str
    reasons: tuple[str, ...]
    # How the files were checked, for the restore's line: by sha256, or (an image volume the
    # runtime pulled by digest, ``volume``) by size.
    checked: str = ""


def marker(env: RuntimeEnv, digest: str) -> Path:
    return env.snapshot_marks / f"kernelbake-snapshot-failed-{digest.removeprefix('sha256:')[:16]}"


def _read_manifest(env: RuntimeEnv) -> tuple[bytes | None, str | None]:
    path = env.snapshot_root / SNAPSHOT_MANIFEST
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror})"
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MANIFEST_BYTES:
        return None, f"{path}: not a plain file of at most {MAX_MANIFEST_BYTES} B"
    try:
        return path.read_bytes(), None
    except OSError as exc:
        return None, f"{path}: cannot be read ({exc.strerror})"


def _file_problems(root: Path, manifest: SnapshotManifest, *, hashed: bool) -> list[str]:
    """Every listed file present, plain and of its size, nothing unlisted; then, only where all
    of that holds and ``hashed``, each file's sha256 (``hashing``: several at once), stopping at
    the first that differs: one is reason enough, and the baked start waits for this answer."""
    found = list(_listing_problems(root, manifest))
    if found or not hashed:
        return found
    recorded = {root / f.path: f for f in manifest.files}
    # Closed on the first difference: the files not begun are not hashed.
    with contextlib.closing(hashing.sha256s(list(recorded))) as results:
        for path, got in results:
            f = recorded[path]
            if isinstance(got, OSError):
                return [f"{f.path}: cannot be read ({got.strerror or got})"]
            if got != f.sha256:
                return [f"{f.path}: sha256 {got[:16]}…, {f.sha256[:16]}… recorded (changed)"]
    return []


def _listing_problems(root: Path, manifest: SnapshotManifest) -> Iterator[str]:
    listed = {f.path: f for f in manifest.files}
    for f in manifest.files:
        p = root / f.path
        try:
            st = p.lstat()
        except OSError:
            yield f"{f.path}: missing (the snapshot is incomplete)"
            continue
        if not stat.S_ISREG(st.st_mode):
            yield f"{f.path}: not a plain file"
        elif st.st_size != f.size:
            yield f"{f.path}: {st.st_size} B, {f.size} B recorded (truncated or replaced)"
    for dirpath, _dirs, names in os.walk(root / IMAGES_DIR):
        for name in names:
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            if rel not in listed:
                yield f"{rel}: not listed in {SNAPSHOT_MANIFEST}; a restore reads only what is signed"


# The container's root directory, whose mode a restore gives the one recorded (tests: a folder).
ROOT = Path("/")


def gate(env: RuntimeEnv, user_args: Sequence[str], *, driver: Driver, criu: Criu) -> Gated | None:
    """None where no snapshot is mounted; otherwise what to restore, or why not."""
    data, problem = _read_manifest(env)
    if data is None and problem is None:
        return None
    digest = "sha256:" + hashlib.sha256(data or b"").hexdigest()
    if problem is not None or data is None:
        return Gated(manifest=None, digest=digest, reasons=(problem or "",))
    if env.snapshot_digest is None:
        return Gated(
            manifest=None,
            digest=digest,
            reasons=(f"${SNAPSHOT_DIGEST_ENV} is unset: admission pins a snapshot only after its signature",),
        )
    if env.snapshot_digest != digest:
        return Gated(
            manifest=None,
            digest=digest,
            reasons=(f"{SNAPSHOT_MANIFEST} is {digest}, admission verified {env.snapshot_digest}",),
        )
    if marker(env, digest).exists():
        return Gated(
            manifest=None,
            digest=digest,
            reasons=(f"a restore of {digest[:19]} failed on this node before ({marker(env, digest)})",),
        )
    try:
        manifest = SnapshotManifest.from_json(data, source=str(env.snapshot_root / SNAPSHOT_MANIFEST))
        if env.image_digest is None:
            return Gated(
                manifest=None,
                digest=digest,
                reasons=(f"${IMAGE_DIGEST_ENV} is unset: the image this runs from is not known here",),
            )
        target = TargetConfig.load(env.target_file)
        here = here_key(
            image=env.image_digest,
            cache_key=target.key,
            argv=user_args,
            environ=env.environ,
            driver=driver,
            criu=criu,
            weights=manifest.key.weights,
        )
    except (InvalidSnapshot, KernelbakeError) as exc:
        return Gated(manifest=None, digest=digest, reasons=(str(exc),))
    if found := _misfits(env, manifest, here):
        return Gated(manifest=None, digest=digest, reasons=found)
    # The memory the restore needs, asked before the files are hashed (seconds for tens of GB).
    if short := no_device_room(manifest.device_bytes, driver.memory()) or no_host_room(
        manifest, memory_room()
    ):
        return Gated(manifest=None, digest=digest, reasons=(short,))
    started = time.monotonic()
    pulled = volume.pulled_by_runtime(env.snapshot_root)
    if faults := _file_problems(env.snapshot_root, manifest, hashed=pulled is None):
        return Gated(manifest=None, digest=digest, reasons=tuple(faults[:5]))
    if (held := _pids_held(manifest)) is not None:
        return Gated(manifest=None, digest=digest, reasons=(held,))
    how = f"sizes ({pulled})" if pulled else f"sizes and sha256 ({hashing.workers()} at once)"
    checked = f"{len(manifest.files)} files checked by {how} in {time.monotonic() - started:.2f} s"
    return Gated(manifest=manifest, digest=digest, reasons=(), checked=checked)


def _misfits(env: RuntimeEnv, manifest: SnapshotManifest, here: SnapshotKey) -> tuple[str, ...]:
    """Where this machine does not fit the snapshot: each key field that differs (a different
    serve env by its variables' names), else the hard limits CRIU would have to raise."""
    recorded_env = manifest.environment
    environments = None if recorded_env is None else (recorded_env, serve_env(env.environ))
    if found := tuple(differences(manifest.key, here, environments)):
        return found
    return tuple(p for p in (_missing_capabilities(manifest), _lower_limits(manifest)) if p)


def no_device_room(held: int | None, memory: Sequence[DeviceMemory]) -> str | None:
    """Why a GPU here lacks the memory the snapshot's engine held (``device_bytes``), or None.
    Said before the restore rather than learnt from it: CRIU restores the whole tree before the
    driver's restore fails out of memory, that process can never be restored after it, and the
    node is marked for the snapshot for good, while a restore from the same images works once
    the memory is free (H100, bench/results/restore-room-probe-h100-2026-12-07). Nothing is
    checked where the snapshot recorded nothing or the GPUs cannot be asked."""
    if not held or not memory:
        return None
    short = min(memory, key=lambda m: m.free)
    if short.free >= held:
        return None
    return (
        f"GPU {short.index} has {short.free} B free ({short.used} of its {short.total} B in use), "
        f"and the snapshot's engine held {held} B (another process holds it: the next start "
        "restores once it is free)"
    )


def no_host_room(manifest: SnapshotManifest, room: int | None) -> str | None:
    """Why this container lacks the memory the restored tree needs, or None: CRIU writes the
    processes' pages (the driver's copy of the device state among them, until its restore moves
    it back) into memory, and /dev/shm's copy into a tmpfs; a container whose memory limit is
    below that is killed halfway, and the node marked. Nothing is checked where ``room`` is
    unknown."""
    need = sum(f.size for f in manifest.files if file_kind(f.path) in (FileKind.PAGES, FileKind.DEV_SHM))
    if room is None or room >= need:
        return None
    return (
        f"the snapshot's processes and /dev/shm files need {need} B of memory, and {room} B are "
        "available here (MemAvailable, and what the container's memory limit leaves); run it with "
        "a higher memory limit"
    )


def _missing_capabilities(manifest: SnapshotManifest) -> str | None:
    if manifest.capabilities is None:
        return None
    grantable = grantable_capabilities()
    if not (missing := sorted(set(manifest.capabilities) - set(grantable or ()))):
        return None
    # CRIU gives each process its capabilities back (capset) and fails on the first it cannot.
    unread = "" if grantable is not None else "; its bounding set could not be read"
    return (
        f"the snapshot's processes held capabilities this container cannot give them "
        f"({', '.join(missing)}{unread}): take and restore with one set, none of the runtime's "
        f"defaults (make snapshot: --cap-drop ALL and {', '.join(sorted(SNAPSHOT_CAPABILITIES))}; "
        "the recipe: drop [ALL], add the same), or run this container with --cap-add for each"
    )


def _lower_limits(manifest: SnapshotManifest) -> str | None:
    if manifest.rlimits is None or may_raise_rlimits():
        return None
    if lower := lower_limits(manifest.rlimits, hard_rlimits()):
        # CRIU gives each process its limits back and fails halfway on one it may not raise.
        return (
            f"hard limits lower here than the snapshot's tree had ({'; '.join(lower[:4])}), "
            "and CRIU cannot raise them without CAP_SYS_RESOURCE: run the container with the "
            "limits it was taken with (docker/podman --ulimit)"
        )
    return None


def _pids_held(manifest: SnapshotManifest) -> str | None:
    """Why a pid of the snapshot's tree is not free here, or None."""
    if not (held := tree.in_use(pid for pid, _ in manifest.tree)):
        return None
    # CRIU gives each process back the pid it had, and fails halfway ("Can't fork for 3421:
    # File exists", a host's second restore on the H100, 2026-12-06) where one is taken.
    # A take and a restore in one container: the dumped tree's orphans stay zombies where pid
    # 1 reaps nothing (a shell), holding the pids (the CPU play of the snapshot flow, 2026-12-07).
    if (parent := tree.unreaped(held[0])) is not None:
        what = f"exited, not reaped by its parent {parent}"
        reap = ", or give it a pid 1 that reaps exited processes (docker run --init)"
    else:
        what = " ".join(tree.cmdline(held[0]))[:80] or "no command line"
        reap = ""
    return (
        f"pid {held[0]} ({what}){f' and {len(held) - 1} more' if len(held) > 1 else ''} of the "
        "snapshot's tree is in use here, and CRIU restores each process with the pid it had: "
        f"restore in a pid namespace of its own (a container's){reap}"
    )


def _put_shm(root: Path, manifest: SnapshotManifest, shm: Path) -> None:
    """The dumped tree's /dev/shm files back in place (this container's own tmpfs), with the
    permission bits they had (CRIU checks them)."""
    for f in manifest.files:
        if not under(f.path, SHM_COPY):
            continue
        dest = shm / f.path.rpartition("/")[2]
        if dest.exists():
            raise OSError(f"{dest} exists already; it is not this snapshot's to replace")
        shutil.copyfile(root / f.path, dest)
        if f.mode is not None:
            dest.chmod(f.mode)


def _subreaper() -> None:
    """The restored tree's root becomes this process's child when criu exits (``-d``), so
    ``serve`` can wait for it and pass signals on, as for an engine it started."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _left_behind(manifest: SnapshotManifest) -> list[int]:
    """What a CRIU that failed or was killed halfway left below serve: processes with the
    snapshot's pids (CRIU gives each its own back), and what is below them."""
    ours = set(tree.descendants(os.getpid()))
    found = [pid for pid, _ in manifest.tree if pid in ours]
    return sorted({p for pid in found for p in (pid, *tree.descendants(pid))})


def _kill(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


def _healthy(url: str, deadline: float, alive: Callable[[], bool]) -> bool:
    while time.monotonic() < deadline:
        if http.status(url, timeout=0.5) == 200:
            return True
        if not alive():
            return False
        time.sleep(0.05)
    return False


class _Root:
    """The restored root, asked whether it still runs; once it has ended, how (its status is
    reaped on the way, so it is kept for the message)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.ended: str | None = None

    def alive(self) -> bool:
        if self.ended is not None:
            return False
        try:
            done, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            # Not our child (no subreaper): alive while it exists.
            if Path(f"/proc/{self.pid}").exists():
                return True
            self.ended = "ended"
            return False
        if done == 0:
            return True
        code = os.waitstatus_to_exitcode(status)
        self.ended = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return False


def _bring_back(
    env: RuntimeEnv,
    manifest: SnapshotManifest,
    work: Path,
    driver: Driver,
    criu: Criu,
    phases: dict[str, float],
    deadline: float,
) -> tuple[int | None, list[int], str | None]:
    """``criu restore`` (by ``deadline``) and the driver's restore of each process it
    checkpointed: (root, pids, why it failed)."""
    pidfile = work / "root.pid"
    t = time.monotonic()
    try:
        ok, criu_log = criu.restore(env.snapshot_root / IMAGES_DIR, work, pidfile, max(1.0, deadline - t))
    except RestoreTimedOut as exc:
        return None, [], str(exc)
    phases["criu restore"] = time.monotonic() - t
    # CRIU kills what it restored when it fails; after success the tree is the live one below
    # the root it names (the same pids it was dumped with).
    root = _root(pidfile) if ok else None
    pids = tree.descendants(root) if root is not None else []
    if not ok:
        return root, pids, f"criu restore failed: {failure(Path(criu_log))}"
    if root is None:
        return None, pids, f"criu restore wrote no root pid to {pidfile}"
    if missing := sorted(set(manifest.gpu_pids) - set(pids)):
        return (
            root,
            pids,
            f"criu restored no process with pid {missing[0]}, whose device state the driver holds",
        )
    t = time.monotonic()
    try:
        for pid in manifest.gpu_pids:
            driver.restore(pid)
    except KernelbakeError as exc:
        return root, pids, f"the driver's restore failed: {exc}"
    phases["driver restore"] = time.monotonic() - t
    return root, pids, None


def _awake(
    base: str, deadline: float, phases: dict[str, float], weights: Weights, beside: Path
) -> str | None:
    """A snapshot taken asleep: vLLM woken, and its weights reloaded from the model's files
    (outside) or copied back from the snapshot's (beside, in ``beside``), by the deadline; why
    not, or None."""
    t = time.monotonic()
    if (code := http.post(base + "/wake_up", {}, timeout=max(1.0, deadline - t))) != 200:
        return f"{base}/wake_up answered {code}"
    phases["woken"] = time.monotonic() - t
    t = time.monotonic()
    if weights is Weights.BESIDE:
        code, answer = http.rpc(base, LOAD_WEIGHTS, timeout=max(1.0, deadline - t), path=str(beside))
        if code != 200:
            return f"{base}/collective_rpc {LOAD_WEIGHTS} answered {code}: {answer}"
        phases["weights copied"] = time.monotonic() - t
        return None
    code, answer = http.rpc(base, http.RELOAD_WEIGHTS, timeout=max(1.0, deadline - t))
    if code != 200:
        return f"{base}/collective_rpc {http.RELOAD_WEIGHTS} answered {code}: {answer}"
    phases["weights reloaded"] = time.monotonic() - t
    return None


def _serving(
    manifest: SnapshotManifest, root: int, deadline: float, phases: dict[str, float], beside: Path
) -> str | None:
    """The restored tree answering, and, taken asleep, woken and its weights back, by the
    deadline: why not, or None. Such a tree's /health stays 503 while RELOADING_MARK exists, so
    its return is asked of /is_sleeping, which the API server answers once the engine core is
    back."""
    base = f"http://127.0.0.1:{manifest.health_port}"
    asleep = manifest.key.weights.asleep
    path = "/is_sleeping" if asleep else manifest.health_path
    t = time.monotonic()
    restored = _Root(root)
    if not _healthy(base + path, deadline, restored.alive):
        if restored.ended is not None:
            # Not a slow start: waiting out the deadline would not have helped.
            return (
                f"the restored tree {restored.ended} {time.monotonic() - t:.2f} s after the restore, "
                f"before {base}{path} answered 200"
            )
        return f"{base}{path} did not answer 200 within {manifest.deadline_s:.0f} s of the restore"
    phases[path] = time.monotonic() - t
    return _awake(base, deadline, phases, manifest.key.weights, beside) if asleep else None


def restore(env: RuntimeEnv, gated: Gated, *, driver: Driver, criu: Criu, say: Say) -> int | None:
    """The one attempt. The root's exit code once the restored tree ends, or None (failed:
    killed, marked; ``serve`` starts the baked way)."""
    manifest = gated.manifest
    assert manifest is not None
    started = time.monotonic()
    _subreaper()
    try:
        env.scratch.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="kernelbake-restore-", dir=env.scratch))
        log = Path(ENGINE_LOG)
        log.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(env.snapshot_root / ENGINE_LOG_COPY, log)
        _put_shm(env.snapshot_root, manifest, Path(SHM_DIR))
        here = stat.S_IMODE(ROOT.stat().st_mode)
        if manifest.root_mode is not None and here != manifest.root_mode == here | 0o200:
            # CRIU restores only onto the root mode the tree saw. Podman's rootfs lacks the
            # owner's write bit that Docker's has, and that bit alone is given (root, the owner,
            # writes there anyway); any other difference is left for CRIU to refuse.
            ROOT.chmod(manifest.root_mode)
    except OSError as exc:
        # Nothing was restored yet: a refusal like the gate's, not a failed attempt.
        say(f"snapshot not used: cannot prepare the restore ({exc}); starting the baked way")
        return None
    phases: dict[str, float] = {}
    mark = Path(RELOADING_MARK)
    ahead: readahead.ReadAhead | None = None
    if manifest.key.weights.asleep:
        with contextlib.suppress(OSError):
            mark.write_text("")
        # CRIU reads the images now and, after the wake-up, the weights are read: the model's
        # files by the reload (outside) or the snapshot's own copy (beside). All of it is read
        # beside CRIU's work, in that order, not after it.
        ahead = readahead.start(
            Path(manifest.key.cache_key.model_path) if manifest.key.weights is Weights.OUTSIDE else None,
            images=[env.snapshot_root / path for path in _in_reading_order(manifest)],
        )
    root, pids, why = _bring_back(env, manifest, work, driver, criu, phases, started + manifest.deadline_s)
    if why is None and root is not None:
        why = _serving(
            manifest, root, started + manifest.deadline_s, phases, env.snapshot_root / WEIGHTS_COPY
        )
    # /health answers 200 from here on: the weights are back, or the tree is about to be killed.
    with contextlib.suppress(OSError):
        mark.unlink(missing_ok=True)
    if why is not None:
        _kill(tree.descendants(root) if root is not None else _left_behind(manifest))
        path = marker(env, gated.digest)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{gated.digest}\n{why}\n")
        say(
            f"snapshot not used: {why}; the tree was killed, this node is marked ({path}); starting the baked way"
        )
        return None
    shown = ", ".join(f"{k} {v:.2f} s" for k, v in phases.items())
    say(
        f"restored snapshot {gated.digest[:19]} ({len(pids)} processes, {manifest.total_bytes} B, weights "
        f"{manifest.key.weights.value}), serving {time.monotonic() - started:.2f} s after the start of the restore "
        f"({shown}; {gated.checked} before it){f'; {ahead.said()}' if ahead is not None else ''}; "
        f"the engine's output goes on in {ENGINE_LOG}"
    )
    assert root is not None
    return _supervise(root, [pid for pid, _ in manifest.tree])


def _in_reading_order(manifest: SnapshotManifest) -> list[str]:
    """The snapshot's files as the restore reads them: CRIU's images, then the weights kept
    beside them (read after the wake-up)."""
    files = [f.path for f in manifest.files if under(f.path, IMAGES_DIR)]
    return sorted(files, key=lambda path: under(path, WEIGHTS_COPY))


def _root(pidfile: Path) -> int | None:
    try:
        text = pidfile.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 1 else None


# How long the restored tree's other processes get to end after its root did, before SIGKILL.
STRAGGLER_GRACE_S = 10.0


def _end_stragglers(pids: Sequence[int], grace_s: float = STRAGGLER_GRACE_S) -> list[int]:
    """The restored tree's processes still running once its root ended (this process adopted
    them, as the subreaper, when their parents ended first): SIGTERM, SIGKILL after ``grace_s``,
    reaped. On a host nothing else would end them: after a restored serve stopped on the H100
    (2026-12-06), one of the tree's processes was still there, and the next restore could not
    have its pid. Those still running when asked."""
    left = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for pid in left:
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                # Not ours to reap: gone once /proc says so.
                done = 0 if Path(f"/proc/{pid}").exists() else pid
            if done:
                break
            if time.monotonic() >= deadline:
                _kill([pid])
                break
            time.sleep(0.05)
    return left


def _supervise(root: int, members: Sequence[int]) -> int:
    """Wait for the restored root as for a child, passing SIGTERM/SIGINT/SIGHUP on; then for
    the rest of its tree: those of ``members`` (the snapshot's pids) still below this process,
    so a pid reused by another process is never signalled."""
    try:
        return _wait_root(root)
    finally:
        below = set(tree.descendants(os.getpid())[1:])
        _end_stragglers([pid for pid in members if pid in below and pid != root])


def _wait_root(root: int) -> int:
    """The root's exit code, waited for as a child's."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(root, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            _, status = os.waitpid(root, 0)
            return os.waitstatus_to_exitcode(status)
        except InterruptedError:
            continue
        except ChildProcessError:
            while Path(f"/proc/{root}").exists():
                time.sleep(0.5)
            return 0


def start_from_snapshot(
    env: RuntimeEnv, user_args: Sequence[str], *, driver: Driver, criu: Criu, say: Say
) -> int | None:
    """``serve``'s first step: the restored engine's exit code, or None for the baked start."""
    # One a killed serve left (an emptyDir /tmp outlives the container) would hold the next
    # start's /health at 503 for good.
    with contextlib.suppress(OSError):
        Path(RELOADING_MARK).unlink(missing_ok=True)
    gated = gate(env, user_args, driver=driver, criu=criu)
    if gated is None:
        return None
    if gated.manifest is None:
        say(f"snapshot not used: {'; '.join(gated.reasons)}; starting the baked way")
        return None
    return restore(env, gated, driver=driver, criu=criu, say=say)
