"""``kernelbake snapshot take``: start the baked engine the way ``serve`` does, warm it with
requests, wait until no client is connected, and dump its process tree with CRIU (after the
driver's checkpoint of each process, a no-op without a GPU) into a snapshot directory:
``images/`` (CRIU's files and the engine's log as it was) and ``snapshot.json`` (the key and
every file's sha256), written last, so a directory without it is not a snapshot.

Refused before anything is started: a secret in the environment or the arguments (a restored
process would carry it to every replica), and, before the dump, any in a process of the tree.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.contract.key import Engine
from kernelbake.contract.snapshot import (
    ENGINE_LOG,
    ENGINE_LOG_COPY,
    IMAGES_DIR,
    LOAD_WEIGHTS,
    RELOADING_MARK,
    SAVE_WEIGHTS,
    SHM_COPY,
    SHM_DIR,
    SNAPSHOT_MANIFEST,
    WEIGHTS_COPY,
    WEIGHTS_EXTENSION,
    SnapshotFile,
    SnapshotManifest,
    Weights,
    under,
)
from kernelbake.contract.target import TargetConfig
from kernelbake.errors import BadInput, EnvironmentProblem, KernelbakeError
from kernelbake.runner import spawn
from kernelbake.runtime import nvml
from kernelbake.runtime.env import SNAPSHOT_TAKE_ENV, RuntimeEnv
from kernelbake.runtime.redact import argv_secrets, is_secret, secret_flags
from kernelbake.runtime.snapshot import hashing, http, io_uring, tree
from kernelbake.runtime.snapshot.criu import Criu, failure
from kernelbake.runtime.snapshot.devguard import MIDDLEWARE
from kernelbake.runtime.snapshot.driver import DeviceMemory, Driver, rise
from kernelbake.runtime.snapshot.machine import hard_rlimits, held_capabilities, here_key, serve_env

# CRIU restores every process with the pid it had. The restoring container's own processes
# (serve, criu and the helpers it forks) take the lowest pids of a fresh pid namespace, so the
# tree is started above them.
PID_FLOOR = 1000
# How long a process asked to shut NVML down has to close its device files (a Python handler
# runs between two bytecodes of the main thread; the engine's is idle at this point).
NVML_RELEASE_S = 10.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    image: str  # sha256:… of the image this runs in (the host knows it; the process cannot)
    user_args: tuple[str, ...] = ()
    # Where take looks for the engine: None, the engine's own --port (served_port). Given, it
    # must agree with that, or take would wait its whole ready timeout on a port nobody opens.
    port: int | None = None
    health_path: str = "/health"
    warmup_requests: int = 3
    # How long the engine may take to reach /health at take time, and how long past the
    # restore it may take then (recorded; serve kills a restore that misses it).
    ready_timeout_s: float = 600.0
    deadline_s: float = 30.0
    quiet_timeout_s: float = 30.0
    # The tree to start; empty: ``kernelbake serve USER_ARGS`` (what the CLI always takes).
    command: tuple[str, ...] = ()
    # OUTSIDE: vLLM's sleep mode level 2 before the dump (weights and KV cache freed), so the
    # snapshot holds no weights and ``serve`` wakes the engine and reloads them after restore.
    # BESIDE: asleep too, the engine's weight memory saved first as files in the snapshot, which
    # ``serve`` copies back after the wake-up.
    weights: Weights = Weights.INSIDE


@dataclasses.dataclass(frozen=True, kw_only=True)
class Taken:
    out: Path
    manifest: SnapshotManifest

    def lines(self) -> list[str]:
        m = self.manifest
        t = m.taken
        lines = [
            f"snapshot of {len(m.tree)} processes ({', '.join(c.split()[0] for _, c in m.tree)}) in {self.out}: "
            f"{len(m.files)} files, {m.total_bytes} B; key {m.key.digest}",
            f"ready {t.get('ready_s', 0):.1f} s, warm-up {t.get('warmup_s', 0):.1f} s, "
            f"driver checkpoint {t.get('checkpoint_s', 0):.2f} s, criu dump {t.get('dump_s', 0):.2f} s, "
            f"hashed in {t.get('hash_s', 0):.2f} s; snapshot.json {m.digest}",
        ]
        if "save_weights_s" in t:
            lines.append(
                f"weights beside: {int(t.get('weights_bytes', 0))} B saved in {t['save_weights_s']:.2f} s, "
                f"copied back once in {t.get('copy_weights_s', 0):.2f} s (every restore copies them so)"
            )
        if m.device_bytes:
            lines.append(
                f"the engine held {m.device_bytes} B of GPU memory awake: a restore needs that much "
                "free, or serve starts the baked way"
            )
        return lines


# One request each engine's server answers, as its own clients send it.
def _warm_vllm(base: str) -> None:
    model = http.get_json(f"{base}/v1/models")["data"][0]["id"]
    http.post_json(
        f"{base}/v1/completions",
        # Token ids: a server started with --skip-tokenizer-init refuses text.
        {"model": model, "prompt": list(range(1, 17)), "max_tokens": 8, "temperature": 0},
    )


def _warm_torch(base: str) -> None:
    http.post_json(f"{base}/v1/generate", {"input_ids": [[1, 2, 3, 4]], "max_new_tokens": 8})


WARMUPS: dict[Engine, Callable[[str], None]] = {Engine.VLLM: _warm_vllm, Engine.TORCH: _warm_torch}


def refuse_secrets(environ: Mapping[str, str], argv: Sequence[str], where: str) -> None:
    names = sorted(n for n, v in environ.items() if is_secret(n) and v)
    flags = secret_flags(argv)
    if names or flags or argv_secrets(argv):
        shown = ", ".join([*(f"${n}" for n in names), *flags])
        raise BadInput(
            f"{where}: {shown} would be frozen into the snapshot and restored on every replica; "
            "a snapshot is taken without secrets (pass them after restore, through a file the server reads)"
        )


def _flag_values(args: Sequence[str], flag: str) -> list[str]:
    """The values ``args`` give ``flag`` (``--flag V`` or ``--flag=V``)."""
    out = [a.partition("=")[2] for a in args if a.startswith(flag + "=")]
    out += [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
    return out


def weights_out_problems(
    target: TargetConfig,
    environ: Mapping[str, str],
    user_args: Sequence[str],
    weights: Weights = Weights.OUTSIDE,
) -> list[str]:
    """What a snapshot taken asleep needs and this start lacks: vLLM, its sleep mode (which
    changes vLLM's compile hash, so the image is best baked with it), the development endpoints
    that sleep, wake and reload, and the guard that keeps those on loopback in every replica
    (``devguard``); with the weights beside, the worker extension that saves and copies them."""
    args = [*target.serve.extra_args, *user_args]
    problems = []
    if target.key.engine is not Engine.VLLM:
        problems.append(
            f"the {target.key.engine.value} engine has no sleep mode; take it with the weights inside"
        )
    if "--enable-sleep-mode" not in args:
        problems.append("the engine runs without --enable-sleep-mode (add it to the spec's serve.extra_args)")
    if environ.get("VLLM_SERVER_DEV_MODE") != "1":
        problems.append(
            "VLLM_SERVER_DEV_MODE=1 is unset (the /sleep, /wake_up and /collective_rpc endpoints)"
        )
    if MIDDLEWARE not in _flag_values(args, "--middleware"):
        problems.append(f"--middleware {MIDDLEWARE} is missing (it keeps those endpoints on loopback)")
    if weights is Weights.BESIDE and _flag_values(args, "--worker-extension-cls") != [WEIGHTS_EXTENSION]:
        problems.append(
            f"--worker-extension-cls {WEIGHTS_EXTENSION} is missing (it saves the weights and copies "
            "them back; vLLM leaves it out of its compile hash)"
        )
    return problems


def _reload_once(base: str) -> None:
    """The reload every restore of this snapshot will ask for, asked once now, awake: whether
    the engine can reload its weights with these arguments is the engine's to say (vLLM 0.32
    cannot from ``--load-format dummy`` or ``sharded_state``: HTTP 500). A snapshot whose every
    restore would fail is not taken."""
    code, answer = http.rpc(base, http.RELOAD_WEIGHTS, timeout=600)
    if code != 200:
        raise EnvironmentProblem(
            f"{base}/collective_rpc {http.RELOAD_WEIGHTS} answered {code}: this engine cannot reload "
            f"its weights with these arguments ({answer}), so every restore of a snapshot without "
            "them would fail; "
            f"serve weight files through a load format that reloads (vLLM's default does), or take "
            f"it with --weights inside. The engine's log: {ENGINE_LOG}"
        )


def _save_weights(base: str, folder: Path) -> dict[str, float]:
    """The engine's weight memory saved into ``folder`` by its worker extension, then copied
    back once, awake: the copy every restore of this snapshot makes, asked of this engine now
    (a snapshot whose every restore would fail is not taken). How long each took."""
    out: dict[str, float] = {}
    for what, method in (("save_weights_s", SAVE_WEIGHTS), ("copy_weights_s", LOAD_WEIGHTS)):
        t = time.monotonic()
        code, answer = http.rpc(base, method, timeout=900, path=str(folder))
        if code != 200:
            raise EnvironmentProblem(
                f"{base}/collective_rpc {method} answered {code}: {answer}; the engine's weights "
                f"cannot be kept beside this snapshot. Take it with --weights outside or inside. "
                f"The engine's log: {ENGINE_LOG}"
            )
        out[what] = time.monotonic() - t
        if isinstance(answer, dict) and isinstance(answer.get("bytes"), int):
            out["weights_bytes"] = float(answer["bytes"])
    return out


def _sleep(base: str) -> None:
    """vLLM's sleep mode level 2: the weights and the KV cache are freed on the GPU."""
    if (code := http.post(f"{base}/sleep?level=2", {}, timeout=300)) != 200:
        raise EnvironmentProblem(f"{base}/sleep?level=2 answered {code}; the engine did not go to sleep")
    if http.get_json(f"{base}/is_sleeping").get("is_sleeping") is not True:
        raise EnvironmentProblem(f"{base}/is_sleeping does not say the engine sleeps after /sleep?level=2")


def _files(out: Path) -> list[SnapshotFile]:
    """Every file CRIU and take wrote under ``images/``, with its size, sha256 (``hashing``:
    several at once) and, for the /dev/shm copies, the mode CRIU restores them with."""
    paths = [Path(dirpath) / name for dirpath, _dirs, names in os.walk(out / IMAGES_DIR) for name in names]
    shas: dict[Path, str] = {}
    # Closed on an unreadable file: the files not begun are not hashed.
    with contextlib.closing(hashing.sha256s(paths)) as results:
        for p, sha in results:
            if isinstance(sha, OSError):
                raise EnvironmentProblem(
                    f"{p}: cannot be read to hash it ({sha}); the snapshot in {out} is incomplete"
                )
            shas[p] = sha
    # Listed in the walk's order, not the order the hashing finished in: the same files, the
    # same manifest.
    found = []
    for p in paths:
        rel = p.relative_to(out).as_posix()
        st = p.stat()
        mode = st.st_mode & 0o777 if under(rel, SHM_COPY) else None
        found.append(SnapshotFile(path=rel, size=st.st_size, sha256=shas[p], mode=mode))
    return found


def _wait_ready(proc: Any, url: str, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise EnvironmentProblem(
                f"the engine exited with {proc.returncode} before {url} answered; its output: {ENGINE_LOG}"
            )
        if http.status(url) == 200:
            return
        time.sleep(0.2)
    raise EnvironmentProblem(
        f"{url} did not answer 200 within {timeout_s:.0f} s; the engine's output: {ENGINE_LOG}"
    )


def _wait_quiet(pids: list[int], port: int, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while (n := tree.clients(pids, port)) and time.monotonic() < end:
        time.sleep(0.1)
    if n:
        raise EnvironmentProblem(
            f"{n} client connections to port {port} stayed open for {timeout_s:.0f} s; a snapshot is "
            "taken with none (close them, or keep other clients off the engine while it is taken)"
        )


def _check_tree(pids: list[int]) -> None:
    for pid in pids:
        cmd = " ".join(tree.cmdline(pid))[:80]
        if found := tree.secrets(pid):
            raise BadInput(
                f"pid {pid} ({cmd}): {', '.join(found)} would be frozen into the snapshot; not taking it"
            )
        if fds := tree.io_urings(pid):
            raise EnvironmentProblem(
                f"pid {pid} ({cmd}) holds an io_uring on fd {', '.join(fds)}, which CRIU cannot dump; "
                "it was started outside kernelbake snapshot take's seccomp filter"
            )


def _shm_files(shm: Path) -> list[Path]:
    """The plain files in the container's /dev/shm (what take copies beside the dump)."""
    try:
        return [e for e in sorted(shm.iterdir()) if e.is_file() and not e.is_symlink()]
    except OSError:
        return []


def _copy_shm(shm: Path, dest: Path) -> None:
    """The plain files in the container's /dev/shm, as the dump left them."""
    for entry in _shm_files(shm):
        dest.mkdir(parents=True, exist_ok=True)
        # copy2 keeps the permission bits, which CRIU checks when it reopens the file.
        shutil.copy2(entry, dest / entry.name)


def _shm_names(shm: Path) -> frozenset[str]:
    try:
        return frozenset(entry.name for entry in shm.iterdir())
    except OSError:
        return frozenset()


# What CRIU names the link it makes, in the file's own directory, to a file the dumped tree
# had unlinked but still held (``--link-remap``; the restore opens it by that name and removes
# it). multiprocessing's semaphores are such files in /dev/shm.
_LINK_REMAP = "link_remap."
# CRIU's own files beside the memory it writes (descriptors, the tree, its log).
DUMP_SLACK = 64 << 20


def _tidy_shm(shm: Path, before: frozenset[str]) -> list[str]:
    """CRIU's ``link_remap.N`` files that appeared in /dev/shm since ``before`` (this dump's),
    removed once copied into the snapshot (or once the dump failed): left there, the next take
    in this /dev/shm fails on the same name ("Can't link remap to /dev/shm/sem.kQGSOi: File
    exists", a second take on one H100, 2026-12-06) and a restore into it finds the name taken.
    Nothing else there is touched: it may be another process's. The names removed."""
    gone = []
    for name in sorted(_shm_names(shm) - before):
        entry = shm / name
        if name.startswith(_LINK_REMAP) and entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)
            gone.append(name)
    return gone


def _kill(pids: Sequence[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue


# ``vllm serve``'s own default for --port, where the engine listens when its arguments name none.
ENGINE_DEFAULT_PORT = 8000


def _engine_port(args: Sequence[str]) -> int | None:
    """The --port the engine's arguments give (the last, as argparse reads them), or None."""
    found: str | None = None
    for i, arg in enumerate(args):
        if arg == "--port" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith("--port="):
            found = arg.partition("=")[2]
    if found is None:
        return None
    if not found.isdigit() or not 0 < int(found) < 65536:
        raise BadInput(f"kernelbake snapshot take: the engine's --port {found!r} is not a port number")
    return int(found)


def served_port(options: Options) -> int:
    """The port the engine will answer on: its arguments' --port, else vLLM's default; take's
    --port, when given, only confirms it."""
    said = _engine_port(options.user_args)
    port = ENGINE_DEFAULT_PORT if said is None else said
    if options.port is not None and options.port != port:
        where = f"--port {said}" if said is not None else f"no --port (vLLM's default, {port})"
        raise BadInput(
            f"kernelbake snapshot take --port {options.port}: the engine's arguments give {where}; "
            "take would wait on a port the engine never opens. Give the port once, in the engine's arguments"
        )
    return port


def _target(env: RuntimeEnv, out: Path, options: Options) -> TargetConfig:
    """The image's target, once nothing rules the snapshot out before the engine starts."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInput(f"{out}: not an empty directory; a snapshot is written only into a new or empty one")
    refuse_secrets(env.environ, options.user_args, "kernelbake snapshot take")
    target = TargetConfig.load(env.target_file)
    if options.weights.asleep and (
        found := weights_out_problems(target, env.environ, options.user_args, options.weights)
    ):
        raise BadInput(f"kernelbake snapshot take --weights {options.weights.value}: {'; '.join(found)}")
    return target


def _warmed(
    proc: Any, target: TargetConfig, options: Options, port: int, started: float, out: Path, driver: Driver
) -> tuple[dict[str, float], tuple[DeviceMemory, ...]]:
    """Ready, warmed up (and asleep, with the weights outside or beside; beside, saved into
    ``out`` first): how long each took, and the GPUs' memory once warmed up, before any sleep
    gives the weights' memory back (what a restore needs free)."""
    base = f"http://127.0.0.1:{port}"
    _wait_ready(proc, base + options.health_path, options.ready_timeout_s)
    taken = {"ready_s": time.monotonic() - started}
    t = time.monotonic()
    for _ in range(options.warmup_requests):
        WARMUPS[target.key.engine](base)
    taken["warmup_s"] = time.monotonic() - t
    awake = driver.memory()
    if options.weights is Weights.OUTSIDE:
        t = time.monotonic()
        _reload_once(base)
        taken["reload_s"] = time.monotonic() - t
    elif options.weights is Weights.BESIDE:
        taken |= _save_weights(base, out.resolve() / WEIGHTS_COPY)
    if options.weights.asleep:
        t = time.monotonic()
        _sleep(base)
        taken["sleep_s"] = time.monotonic() - t
    return taken, awake


def _give_back(driver: Driver, pids: list[int]) -> None:
    """The device state of processes the driver checkpointed, restored in place (take stops)."""
    for pid in pids:
        driver.restore(pid)


def _checkpoint(driver: Driver, pids: list[int]) -> list[int]:
    """The driver's checkpoint of each process that holds the GPU (its device files open or
    mapped), which are the processes with device state to move: the driver refuses one without
    a CUDA context (CUresult 3 on the H100 for the tree's root, serve, which queries the GPU only
    from a child). Those checkpointed; on a failure, their state given back first."""
    done: list[int] = []
    for pid in pids:
        if not tree.gpu_files(pid):
            continue
        try:
            driver.checkpoint(pid)
        except KernelbakeError as exc:
            _give_back(driver, done)
            cmd = " ".join(tree.cmdline(pid))[:80]
            raise EnvironmentProblem(
                f"pid {pid} ({cmd}) holds the GPU, but the driver could not checkpoint it: {exc}. "
                "A process that opened the GPU without a CUDA context (an NVML query) cannot be "
                "checkpointed: it must query the GPU from a child process"
            ) from exc
        done.append(pid)
    return done


def _release_nvml(pids: list[int], kill: Callable[[int, int], None] = os.kill) -> list[int]:
    """Each process still holding GPU device files after the driver's checkpoint, and catching
    ``nvml.RELEASE_SIGNAL``, asked to shut NVML down (``runtime.nvml``); then a wait of
    up to NVML_RELEASE_S for their files to close. The pids asked."""
    asked = [pid for pid in pids if tree.gpu_files(pid) and tree.catches(pid, nvml.RELEASE_SIGNAL)]
    for pid in asked:
        # One gone meanwhile holds nothing: the check after the wait says what is left.
        with contextlib.suppress(ProcessLookupError):
            kill(pid, nvml.RELEASE_SIGNAL)
    deadline = time.monotonic() + NVML_RELEASE_S
    while any(tree.gpu_files(pid) for pid in asked) and time.monotonic() < deadline:
        time.sleep(0.05)
    return asked


def _room(pids: list[int], images: Path, shm: Path | None = None) -> tuple[int, str | None]:
    """What the dump needs where it goes, and why it would not fit there (None: it fits). Asked
    of the tree once the driver holds its device state in host memory (what the dump writes is
    then the processes' memory), and with /dev/shm's files, which are copied after it. The need
    is kept in the manifest, so that a run can set it beside what CRIU wrote."""
    shm = Path(SHM_DIR) if shm is None else shm
    shm_bytes = 0
    for f in _shm_files(shm):
        with contextlib.suppress(FileNotFoundError):  # the tree still runs: one may go meanwhile
            shm_bytes += f.stat().st_size
    need = sum(tree.dumped_bytes(pid) for pid in pids) + shm_bytes + DUMP_SLACK
    if (free := shutil.disk_usage(images).free) >= need:
        return need, None
    return need, (
        f"{images}: the dump of {len(pids)} process{'es' if len(pids) != 1 else ''} needs about "
        f"{need} B (their memory, "
        f"{shm}'s files and {DUMP_SLACK} B for CRIU's own), and {free} B are free there; "
        "take the snapshot onto a larger disk"
    )


def _dump(
    env: RuntimeEnv, proc: Any, pids: list[int], out: Path, *, driver: Driver, criu: Criu
) -> tuple[dict[str, float], list[int]]:
    """The device state checkpointed, then the tree dumped into ``out``: how long each took,
    and the processes whose device state the driver holds (the restore gives it back to them).
    A failed dump gives the device state back and stops here."""
    t = time.monotonic()
    gpu_pids = _checkpoint(driver, pids)
    taken = {"checkpoint_s": time.monotonic() - t}
    t = time.monotonic()
    asked = _release_nvml(pids)
    taken["nvml_release_s"] = time.monotonic() - t
    if held := [(pid, files) for pid in pids if (files := tree.gpu_files(pid))]:
        # CRIU would fail on them with a line deep in its log; said here, before it runs.
        _give_back(driver, gpu_pids)
        pid, files = held[0]
        cmd = " ".join(tree.cmdline(pid))[:80]
        why = (
            f"it was asked to shut NVML down and still held them {NVML_RELEASE_S:g} s later"
            if pid in asked
            else "it has no kernelbake handler to shut NVML down (an engine not started through "
            "vLLM's kernelbake plugin, or a process that is not Python)"
        )
        raise EnvironmentProblem(
            f"pid {pid} ({cmd}) still holds {', '.join(files[:4])} after the driver's checkpoint"
            f"{f' (and {len(held) - 1} more processes)' if len(held) > 1 else ''}; CRIU cannot dump a "
            f"GPU device file, and {why}. The checkpoint closes only what a process holds through a "
            "CUDA context of its own: one that opened the GPU without one (NVML, a device query) or "
            "inherited the files through a fork keeps them. It must close them, query the GPU from a "
            "child process, or be started by spawn or exec rather than by a fork of a process that "
            "held them"
        )
    (out / IMAGES_DIR).mkdir(parents=True, exist_ok=True)
    need, problem = _room(pids, out / IMAGES_DIR)
    taken["room_need_bytes"] = need
    if problem:
        _give_back(driver, gpu_pids)
        raise EnvironmentProblem(problem)
    env.scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kernelbake-snapshot-", dir=env.scratch))
    t = time.monotonic()
    ok, dump_log = criu.dump(proc.pid, out / IMAGES_DIR, work)
    taken["dump_s"] = time.monotonic() - t
    if not ok:
        _give_back(driver, gpu_pids)
        raise EnvironmentProblem(f"criu dump of pid {proc.pid} failed: {failure(Path(dump_log))}")
    return taken, gpu_pids


def take(env: RuntimeEnv, out: Path, options: Options, *, driver: Driver, criu: Criu) -> Taken:
    """The snapshot of this image's engine, started with ``options.user_args``, in ``out``."""
    target = _target(env, out, options)
    port = served_port(options)
    log = Path(ENGINE_LOG)
    if log.exists():
        log.unlink()
    # A restore's mark left in this container would hold the engine's /health at 503 (devguard).
    Path(RELOADING_MARK).unlink(missing_ok=True)
    argv = list(options.command) or [sys.executable, "-m", "kernelbake", "serve", *options.user_args]
    tree.raise_pids(PID_FLOOR)
    shm_before: frozenset[str] | None = None
    started = time.monotonic()
    environ = {**env.environ, SNAPSHOT_TAKE_ENV: "1"}
    idle = driver.memory()
    proc = spawn(argv, env=environ, output=log, preexec=io_uring.deny)
    try:
        taken, awake = _warmed(proc, target, options, port, started, out, driver)
        pids = tree.descendants(proc.pid)
        _wait_quiet(pids, port, options.quiet_timeout_s)
        _check_tree(pids)
        key = here_key(
            image=options.image,
            cache_key=target.key,
            argv=options.user_args,
            environ=env.environ,
            driver=driver,
            criu=criu,
            weights=options.weights,
        )
        commands = tuple((pid, " ".join(tree.cmdline(pid))[:200] or "?") for pid in pids)
        # Read while the root lives (the dump ends it): every process below has these or lower.
        rlimits = hard_rlimits(proc.pid)
        capabilities = held_capabilities(pids)
        root_mode = stat.S_IMODE(Path("/").stat().st_mode)  # the container the tree runs in
        shm_before = _shm_names(Path(SHM_DIR))
        dumped, gpu_pids = _dump(env, proc, pids, out, driver=driver, criu=criu)
        taken |= dumped
        proc.wait()
        shutil.copyfile(log, out / ENGINE_LOG_COPY)
        _copy_shm(Path(SHM_DIR), out / SHM_COPY)
        t = time.monotonic()
        files = _files(out)
        taken["hash_s"] = time.monotonic() - t
        manifest = SnapshotManifest(
            key=key,
            files=tuple(files),
            tree=commands,
            gpu_pids=tuple(gpu_pids),
            health_port=port,
            health_path=options.health_path,
            deadline_s=options.deadline_s,
            taken={k: round(v, 3) for k, v in taken.items()},
            environment=serve_env(env.environ),
            rlimits=rlimits,
            root_mode=root_mode,
            capabilities=capabilities,
            device_bytes=rise(idle, awake),
        )
        (out / SNAPSHOT_MANIFEST).write_text(manifest.to_json())
        return Taken(out=out, manifest=manifest)
    except BaseException:
        # A failed take leaves no copy of the weights behind (tens of GB, and no snapshot.json
        # makes them a snapshot): only what it wrote there itself.
        shutil.rmtree(out / WEIGHTS_COPY, ignore_errors=True)
        raise
    finally:
        # After a dump the tree is gone; after any failure it must not outlive the command
        # (the engine core and workers included, which the root may not have stopped).
        _kill(tree.descendants(proc.pid) if proc.poll() is None else [])
        if proc.poll() is None:
            proc.wait()
        if shm_before is not None:
            _tidy_shm(Path(SHM_DIR), shm_before)
