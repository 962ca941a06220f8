"""Host-side settings. ``Settings.from_env`` is the only reader of the environment on the host;
code inside images reads its own environment in ``kernelbake.runtime.env``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from kernelbake.contract.envvars import DeclaredEnv, Variable

# Every variable ``Settings.from_env`` reads (it can read no other: ``DeclaredEnv``); the CLI
# reference, docs/reference/cli.md, is generated from this table.
VARIABLES = (
    Variable(
        "KERNELBAKE_REGISTRY",
        "repository prefix images go to when no `--push`/`--registry` is given",
        "127.0.0.1:5000/kernelbake",
    ),
    Variable("KERNELBAKE_DOCKER", "the docker command kernelbake runs", "docker"),
    Variable(
        "KERNELBAKE_CRIU_PREFIX",
        "CRIU's private prefix (`make criu`: images/base/criu/install.sh) that a spec's `snapshot: true` copies into the image",
        "$KERNELBAKE_BUILD_DIR/criu",
    ),
    Variable(
        "KERNELBAKE_BUILD_DIR", "where `render` and `build` write contexts, bake files and logs", "build"
    ),
    Variable(
        "DOCKER_CONFIG",
        "folder holding the registry credentials (`config.json`), as docker reads it",
        "$HOME/.docker",
    ),
    Variable("HOME", "home folder, for the default `DOCKER_CONFIG`"),
    Variable(
        "KERNELBAKE_INSECURE_REGISTRIES",
        "comma-separated registries spoken to over plain HTTP besides loopback (docker's `--insecure-registry`)",
    ),
    Variable("KERNELBAKE_SIGNING_KEY", "private key file for `sign` (key-based signing)"),
    Variable("KERNELBAKE_SIGNING_KEY_PASSWORD", "password of that key", "$COSIGN_PASSWORD"),
    Variable(
        "COSIGN_PASSWORD",
        "the key password as cosign users export it; used when `KERNELBAKE_SIGNING_KEY_PASSWORD` is unset",
    ),
    Variable("KERNELBAKE_OIDC_TOKEN", "OIDC identity token for keyless signing", "$SIGSTORE_ID_TOKEN"),
    Variable(
        "SIGSTORE_ID_TOKEN",
        "the identity token as sigstore-python and CI set it; used when `KERNELBAKE_OIDC_TOKEN` is unset",
    ),
    Variable("KERNELBAKE_OIDC_TOKEN_FILE", "file holding the OIDC identity token (read at signing time)"),
    Variable(
        "KERNELBAKE_TRUST_CONFIG",
        "Sigstore client trust config for keyless signing: a path, `sigstore-public-good` or `sigstore-staging`",
        "sigstore-public-good",
    ),
)


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    # Where images go when no --push/--registry is given.
    registry: str = "127.0.0.1:5000/kernelbake"
    docker: str = "docker"
    build_dir: Path = Path("build")
    # CRIU's prefix for images whose spec says ``snapshot: true``; None: ``build_dir``/criu.
    criu_prefix: Path | None = None
    # Registry auth: the folder holding config.json, as docker reads it ($DOCKER_CONFIG).
    docker_config: Path = Path.home() / ".docker"
    # Registries spoken to over plain HTTP besides loopback (docker's --insecure-registry).
    insecure_registries: tuple[str, ...] = ()
    # Signing: a key file (key-based), or keyless with an OIDC identity token.
    signing_key: Path | None = None
    signing_key_password: str | None = dataclasses.field(default=None, repr=False)
    oidc_token: str | None = dataclasses.field(default=None, repr=False)
    oidc_token_file: Path | None = None
    # Sigstore client trust config (trusted root + signing config) for keyless signing: a path,
    # or "sigstore-public-good" / "sigstore-staging".
    trust_config: str = "sigstore-public-good"
    # The whole environment, passed through to the subprocesses we start (docker needs
    # DOCKER_HOST, DOCKER_CONFIG, proxies …), never read field by field elsewhere.
    environ: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def criu(self) -> Path:
        """Where a ``snapshot: true`` image's CRIU is copied from."""
        return self.criu_prefix or self.build_dir / "criu"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = DeclaredEnv(os.environ if environ is None else environ, VARIABLES)
        home = Path(env["HOME"]) if env.get("HOME") else Path.home()
        key = env.get("KERNELBAKE_SIGNING_KEY")
        token_file = env.get("KERNELBAKE_OIDC_TOKEN_FILE")
        return cls(
            registry=env.get("KERNELBAKE_REGISTRY", cls.registry),
            docker=env.get("KERNELBAKE_DOCKER", cls.docker),
            build_dir=Path(env.get("KERNELBAKE_BUILD_DIR", str(cls.build_dir))),
            criu_prefix=Path(prefix) if (prefix := env.get("KERNELBAKE_CRIU_PREFIX")) else None,
            docker_config=Path(env.get("DOCKER_CONFIG") or home / ".docker"),
            insecure_registries=_split(env.get("KERNELBAKE_INSECURE_REGISTRIES", "")),
            signing_key=Path(key) if key else None,
            # COSIGN_PASSWORD is what users of cosign keys already export.
            signing_key_password=env.get("KERNELBAKE_SIGNING_KEY_PASSWORD", env.get("COSIGN_PASSWORD")),
            # SIGSTORE_ID_TOKEN is the name sigstore-python and CI docs use.
            oidc_token=env.get("KERNELBAKE_OIDC_TOKEN") or env.get("SIGSTORE_ID_TOKEN") or None,
            oidc_token_file=Path(token_file) if token_file else None,
            trust_config=env.get("KERNELBAKE_TRUST_CONFIG", cls.trust_config),
            environ=dict(env),
        )
