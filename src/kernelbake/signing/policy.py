"""Who is trusted to sign kernelbake images: the ``verify:`` policy.

```yaml
verify:
  identities:                 # keyless: certificate identity (SAN) + OIDC issuer
    - issuer: https://token.actions.githubusercontent.com
      subject_regex: ^https://github\\.com/acme/images/\\.github/workflows/.+@refs/heads/main$
  keys:                       # key-based: PEM public keys, by path (relative to this file) or inline
    - keys/kernelbake.pub
  trusted_root: trusted_root.json   # Sigstore trusted root for keyless, offline; or sigstore-public-good
  require_attestation: true         # default
```

The policy checks its own invariants when built: trusting nobody is an error (fail closed), an
identity needs exactly one of ``issuer``/``issuer_regex`` and of ``subject``/``subject_regex``,
and regexes must match the whole value.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from kernelbake._suggest import did_you_mean
from kernelbake.errors import BadInput
from kernelbake.signing.keys import PublicKey, load_public_key, load_public_key_file
from kernelbake.textfile import read_text

PUBLIC_GOOD = "sigstore-public-good"
TRUSTED_ROOT_MEDIA_TYPE = "application/vnd.dev.sigstore.trustedroot+json;version=0.1"
_FIELDS = ("identities", "keys", "trusted_root", "require_attestation")
_IDENTITY_FIELDS = ("issuer", "issuer_regex", "subject", "subject_regex")


class PolicyError(BadInput):
    """A policy that does not load; names source:field."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class IdentityRule:
    """One trusted keyless identity: the certificate's OIDC issuer and subject (SAN)."""

    issuer: str | None = None
    issuer_regex: str | None = None
    subject: str | None = None
    subject_regex: str | None = None
    where: str = "identity"

    def __post_init__(self) -> None:
        for exact, regex, name in (
            (self.issuer, self.issuer_regex, "issuer"),
            (self.subject, self.subject_regex, "subject"),
        ):
            if (exact is None) == (regex is None):
                raise PolicyError(f"{self.where}: give exactly one of {name} or {name}_regex")
            if exact is not None and not exact:
                raise PolicyError(f"{self.where}: {name} is empty")
            if regex is not None:
                try:
                    re.compile(regex)
                except re.error as exc:
                    raise PolicyError(
                        f"{self.where}: {name}_regex {regex!r} does not compile: {exc}"
                    ) from None

    @staticmethod
    def _match(value: str, exact: str | None, regex: str | None) -> bool:
        if exact is not None:
            return value == exact
        return regex is not None and re.fullmatch(regex, value) is not None

    def matches(self, issuer: str, subjects: Iterable[str]) -> bool:
        if not self._match(issuer, self.issuer, self.issuer_regex):
            return False
        return any(self._match(s, self.subject, self.subject_regex) for s in subjects)

    def __str__(self) -> str:
        issuer = self.issuer if self.issuer is not None else f"/{self.issuer_regex}/"
        subject = self.subject if self.subject is not None else f"/{self.subject_regex}/"
        return f"{subject} from {issuer}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifyPolicy:
    identities: tuple[IdentityRule, ...] = ()
    keys: tuple[PublicKey, ...] = ()
    # Path to a trusted_root.json, or PUBLIC_GOOD; needed by identities.
    trusted_root: str | None = None
    require_attestation: bool = True
    source: str = "policy"

    def __post_init__(self) -> None:
        if not self.identities and not self.keys:
            raise PolicyError(
                f"{self.source}: trusts no identity and no key, so nothing could verify",
                hint="add identities or keys",
            )
        if self.identities and not self.trusted_root:
            raise PolicyError(
                f"{self.source}: trusted_root: identities need a Sigstore trusted root",
                hint=f"give a trusted_root.json path or {PUBLIC_GOOD!r}",
            )
        if not isinstance(self.require_attestation, bool):
            raise PolicyError(f"{self.source}: require_attestation must be true or false")

    def describe(self) -> str:
        parts = [f"key {k.fingerprint} ({k.name})" for k in self.keys]
        parts += [f"identity {i}" for i in self.identities]
        return "; ".join(parts)

    @classmethod
    def from_mapping(cls, data: Any, *, source: str, base_dir: Path | None = None) -> VerifyPolicy:
        """Validate a parsed ``verify:`` section. Relative paths resolve against ``base_dir``
        (default: the working directory)."""
        if not isinstance(data, Mapping):
            raise PolicyError(f"{source}: expected a mapping with {', '.join(_FIELDS)}")
        for name in data:
            if name not in _FIELDS:
                raise PolicyError(f"{source}: unknown field {name!r}{did_you_mean(str(name), _FIELDS)}")
        base = base_dir or Path.cwd()
        identities = tuple(
            _identity(item, f"{source}: identities[{i}]")
            for i, item in enumerate(_list(data, "identities", source))
        )
        keys = tuple(
            _key(item, f"{source}: keys[{i}]", base) for i, item in enumerate(_list(data, "keys", source))
        )
        trusted_root = data.get("trusted_root")
        if trusted_root is not None:
            trusted_root = _trusted_root(trusted_root, f"{source}: trusted_root", base)
        require = data.get("require_attestation", True)
        if not isinstance(require, bool):
            raise PolicyError(f"{source}: require_attestation: expected true or false, got {require!r}")
        return cls(
            identities=identities,
            keys=keys,
            trusted_root=trusted_root,
            require_attestation=require,
            source=source,
        )


def _list(data: Mapping[str, Any], name: str, source: str) -> list[Any]:
    value = data.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise PolicyError(f"{source}: {name}: expected a list")
    return value


def _identity(item: Any, where: str) -> IdentityRule:
    if not isinstance(item, Mapping):
        raise PolicyError(f"{where}: expected a mapping with issuer/issuer_regex and subject/subject_regex")
    for name in item:
        if name not in _IDENTITY_FIELDS:
            raise PolicyError(f"{where}: unknown field {name!r}{did_you_mean(str(name), _IDENTITY_FIELDS)}")
    values = {}
    for name in _IDENTITY_FIELDS:
        value = item.get(name)
        if value is not None and not isinstance(value, str):
            raise PolicyError(f"{where}: {name} must be a string")
        values[name] = value
    return IdentityRule(where=where, **values)


def _key(item: Any, where: str, base: Path) -> PublicKey:
    if isinstance(item, Mapping):
        unknown = [n for n in item if n not in ("path", "pem")]
        if unknown or len(item) != 1:
            raise PolicyError(f"{where}: expected a path string, inline PEM, or one of path:/pem:")
        item = item.get("path") or item.get("pem")
    if not isinstance(item, str) or not item.strip():
        raise PolicyError(f"{where}: expected a public key path or inline PEM")
    try:
        if item.lstrip().startswith("-----BEGIN"):
            return load_public_key(item.encode(), source=where)
        return load_public_key_file(base / item)
    except BadInput as exc:
        raise PolicyError(f"{where}: {exc}") from None


def _trusted_root(value: Any, where: str, base: Path) -> str:
    if not isinstance(value, str) or not value:
        raise PolicyError(f"{where}: expected a path to trusted_root.json or {PUBLIC_GOOD!r}")
    if value == PUBLIC_GOOD:
        return value
    path = base / value
    try:
        doc = json.loads(read_text(path, "the trusted root", error=PolicyError))
    except PolicyError as exc:
        raise PolicyError(f"{where}: {exc}") from None
    except ValueError:
        raise PolicyError(f"{where}: {path} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("mediaType") != TRUSTED_ROOT_MEDIA_TYPE:
        raise PolicyError(f"{where}: {path} is not a Sigstore trusted root ({TRUSTED_ROOT_MEDIA_TYPE})")
    return str(path)


def load_policy(path: str | Path) -> VerifyPolicy:
    """A policy file: either the ``verify:`` section itself, or a document holding one."""
    p = Path(path)
    text = read_text(p, "policy", error=PolicyError)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"{p}: not YAML ({str(exc).splitlines()[0]})") from None
    source = str(p)
    if isinstance(data, Mapping) and "verify" in data:
        data, source = data["verify"], f"{p}: verify"
    return VerifyPolicy.from_mapping(data, source=source, base_dir=p.parent)
