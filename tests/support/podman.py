"""A pod spec, run with podman: what a kubelet would do with it, for the parts the cache recipes
use. Image volumes become ``--mount type=image`` (podman mounts an image's rootfs read-only,
as Kubernetes does), emptyDirs a host directory shared by the pod's containers, other volumes
the host directories the caller names; a container's dropped and added capabilities and an unconfined
seccomp profile become podman's flags; init containers run to completion first, in order."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kernelbake.pipeline import Built

PODMAN = "podman"
# Podman 4.3 as root raises RLIMIT_NOFILE and RLIMIT_NPROC to 1048576/4194304 in every
# container; CI's machines (and these VMs) refuse that to runc ("error setting rlimits …
# operation not permitted"). Limits below the host's are allowed; vLLM needs nothing above.
ULIMITS = ("--ulimit", "nofile=16384:16384", "--ulimit", "nproc=32768:32768")


def podman(*args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([PODMAN, *args], capture_output=True, text=True, timeout=timeout)
    if check and res.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
        )
    return res


def require_podman() -> None:
    if shutil.which(PODMAN) is None:
        raise AssertionError("podman is missing: apt-get install -y podman (Debian 12's 4.3 mounts images)")


def pull(ref: str) -> None:
    """From the tests' plain-http registry."""
    podman("pull", "--quiet", "--tls-verify=false", ref)


def pulled(built: Built) -> str:
    """A built image's pushed reference, pulled into podman (which must be here)."""
    require_podman()
    assert built.pushed is not None
    pull(built.pushed)
    return built.pushed


class PodRun:
    """The flags for each container of ``spec``; ``hosts`` maps the names of volumes that are
    neither image volumes nor emptyDirs to host directories."""

    def __init__(self, spec: Mapping[str, Any], workdir: Path, hosts: Mapping[str, Path]) -> None:
        self.spec = spec
        self.volumes: dict[str, list[str]] = {}
        self.images: list[str] = []  # what the image volumes name, pulled before the pod starts
        for volume in spec.get("volumes") or []:
            name = volume["name"]
            if "image" in volume:
                ref = volume["image"]["reference"]
                self.volumes[name] = ["--mount", f"type=image,source={ref},destination={{path}}"]
                self.images.append(ref)
            elif "emptyDir" in volume:
                d = workdir / f"emptydir-{name}"
                d.mkdir(parents=True, exist_ok=True)
                self.volumes[name] = ["-v", f"{d}:{{path}}{{ro}}"]
            else:
                self.volumes[name] = ["-v", f"{hosts[name]}:{{path}}{{ro}}"]

    def flags(self, container: Mapping[str, Any]) -> list[str]:
        flags: list[str] = []
        for m in container.get("volumeMounts") or []:
            ro = ":ro" if m.get("readOnly") else ""
            flags += [f.format(path=m["mountPath"], ro=ro) for f in self.volumes[m["name"]]]
        for e in container.get("env") or []:
            flags += ["-e", f"{e['name']}={e['value']}"]
        security = container.get("securityContext") or {}
        caps = security.get("capabilities") or {}
        flags += [f"--cap-drop={c}" for c in caps.get("drop") or []]
        flags += [f"--cap-add={c}" for c in caps.get("add") or []]
        if (security.get("seccompProfile") or {}).get("type") == "Unconfined":
            flags += ["--security-opt", "seccomp=unconfined"]
        if container.get("command"):
            flags += ["--entrypoint", json.dumps(list(container["command"]))]
        return flags

    def init_containers(self) -> None:
        for c in self.spec.get("initContainers") or []:
            podman("run", "--rm", *ULIMITS, *self.flags(c), c["image"], *(c.get("args") or []))

    def main_argv(self, extra: Sequence[str] = ()) -> list[str]:
        """``podman run -d`` argv for the first container, ``extra`` flags before the image."""
        c = self.spec["containers"][0]
        return [PODMAN, "run", "-d", *ULIMITS, *extra, *self.flags(c), c["image"], *(c.get("args") or [])]
