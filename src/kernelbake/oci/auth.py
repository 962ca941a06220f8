"""Registry credentials the way docker finds them: ``$DOCKER_CONFIG/config.json`` ``auths``,
``credHelpers`` and ``credsStore`` (a ``docker-credential-<name>`` helper, run via the runner)."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from pathlib import Path
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.errors import BadInput
from kernelbake.oci.hosts import DOCKER_HUB
from kernelbake.oci.reference import DOCKER_HUB_API
from kernelbake.runner import Runner, run
from kernelbake.textfile import read_text

# docker stores Docker Hub credentials under its v1 index URL.
_HUB_KEYS = ("https://index.docker.io/v1/", "index.docker.io", DOCKER_HUB, DOCKER_HUB_API)
_PARAM = re.compile(r'([A-Za-z_]+)="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class Credentials:
    username: str = ""
    password: str = dataclasses.field(default="", repr=False)
    # An OAuth2 refresh token (docker login against registries that issue one).
    identity_token: str = dataclasses.field(default="", repr=False)


@dataclasses.dataclass(frozen=True)
class Challenge:
    scheme: str  # "basic" or "bearer"
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge | None:
    scheme, _, rest = header.strip().partition(" ")
    if not scheme:
        return None
    return Challenge(scheme.lower(), dict(_PARAM.findall(rest)))


def _host_keys(host: str) -> tuple[str, ...]:
    return _HUB_KEYS if host in _HUB_KEYS else (host, f"https://{host}", f"http://{host}")


def _read_config(config_dir: Path) -> dict[str, Any]:
    path = config_dir / "config.json"
    if not path.exists():
        return {}
    text = read_text(path, "docker config")
    try:
        doc = jsondoc.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"{path}: cannot read docker config ({exc})") from None
    if not isinstance(doc, dict):
        raise BadInput(f"{path}: docker config is not a JSON object")
    return doc


def _from_helper(helper: str, host: str, runner: Runner, timeout: float) -> Credentials | None:
    result = runner([f"docker-credential-{helper}", "get"], capture=True, input=host, timeout=timeout)
    if result.returncode != 0:
        return None  # the helper's way of saying "no credentials for this host"
    try:
        doc = jsondoc.loads(result.stdout)
        user, secret = str(doc["Username"]), str(doc["Secret"])
    except (ValueError, KeyError, TypeError):
        raise BadInput(f"docker-credential-{helper}: unreadable answer for {host}") from None
    if user == "<token>":
        return Credentials(identity_token=secret)
    return Credentials(username=user, password=secret)


def docker_credentials(
    host: str, config_dir: Path, runner: Runner = run, *, timeout: float = 30.0
) -> Credentials | None:
    """Credentials for ``host`` (``host[:port]``), or None for anonymous access; a credential
    helper gets ``timeout`` seconds."""
    config = _read_config(config_dir)
    keys = _host_keys(host)
    helpers = config.get("credHelpers") or {}
    for key in keys:
        if isinstance(helpers, dict) and isinstance(helpers.get(key), str):
            return _from_helper(helpers[key], key, runner, timeout)
    auths = config.get("auths") or {}
    for key in keys:
        entry = auths.get(key) if isinstance(auths, dict) else None
        if not isinstance(entry, dict):
            continue
        if entry.get("identitytoken"):
            return Credentials(identity_token=str(entry["identitytoken"]))
        if entry.get("auth"):
            try:
                user, _, password = base64.b64decode(str(entry["auth"])).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise BadInput(f"{config_dir / 'config.json'}: auths[{key!r}].auth is not base64") from None
            return Credentials(username=user, password=password)
        if entry.get("username"):
            return Credentials(username=str(entry["username"]), password=str(entry.get("password", "")))
    store = config.get("credsStore")
    if isinstance(store, str) and store:
        for key in keys:
            creds = _from_helper(store, key, runner, timeout)
            if creds:
                return creds
    return None
