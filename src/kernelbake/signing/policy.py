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
  unsafe_replica_deltas: false      # default: a cache delta must be rebuilt by a trusted build
```

The policy checks its own invariants when built: trusting nobody is an error (fail closed), an
identity needs exactly one of ``issuer``/``issuer_regex`` and of ``subject``/``subject_regex``,
and regexes must match the whole value. Messages name ``file:line: field`` (``kernelbake.validate``).

Regexes are RE2's (``google-re2``), the syntax of cosign's ``--certificate-identity-regexp`` and of
policy-controller (Go's regexp): they are matched against certificate fields from the registry,
and Python's backtracking ``re`` takes exponential time on some patterns (``^(a+)+$``: 0.62 s at
25 characters, 4 times more per 2). RE2 matches in time linear in the field; what it cannot
match that way (backreferences, lookaround) does not compile, so the policy does not load.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kernelbake.contract import jsondoc
from kernelbake.errors import BadInput
from kernelbake.signing._internal.instances import PUBLIC_GOOD as PUBLIC_GOOD  # re-exported
from kernelbake.signing.keys import PublicKey, load_public_key, load_public_key_file
from kernelbake.textfile import read_text
from kernelbake.validate import Source, load_yaml, quoted

TRUSTED_ROOT_MEDIA_TYPE = "application/vnd.dev.sigstore.trustedroot+json;version=0.1"
_FIELDS = ("identities", "keys", "trusted_root", "require_attestation", "unsafe_replica_deltas")
_IDENTITY_FIELDS = ("issuer", "issuer_regex", "subject", "subject_regex")


class PolicyError(BadInput):
    """A policy that does not load; names file:line: field."""


def _re2() -> Any:
    """The ``re2`` module (a host dependency); without it a policy with a regex does not load."""
    try:
        import re2
    except ImportError:
        raise PolicyError(
            "identity regexes need the google-re2 package", hint="pip install 'kernelbake[host]'"
        ) from None
    return re2


@functools.lru_cache(maxsize=256)
def _regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2; raises ``re2.error``."""
    re2 = _re2()
    options = re2.Options()
    # RE2 otherwise logs each pattern it refuses to stderr; the refusal is the policy's error.
    options.log_errors = False
    return re2.compile(pattern, options=options)


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
                    _regex(regex)
                except _re2().error as exc:
                    why = exc.args[0].decode(errors="replace") if exc.args else str(exc)
                    raise PolicyError(
                        f"{self.where}: {name}_regex {quoted(regex)} does not compile as RE2: {why}",
                        hint="identity regexes are RE2 syntax, as cosign's --certificate-identity-regexp: "
                        "no backreferences or lookaround",
                    ) from None

    @staticmethod
    def _match(value: str, exact: str | None, regex: str | None) -> bool:
        if exact is not None:
            return value == exact
        return regex is not None and _regex(regex).fullmatch(value) is not None

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
    # Accept cache deltas signed as a replica wrote them (origin replica): code that anything
    # able to write that replica's cache root chose, run by every replica that mounts it.
    unsafe_replica_deltas: bool = False
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
        if not isinstance(self.unsafe_replica_deltas, bool):
            raise PolicyError(f"{self.source}: unsafe_replica_deltas must be true or false")

    def describe(self) -> str:
        parts = [f"key {k.fingerprint} ({k.name})" for k in self.keys]
        parts += [f"identity {i}" for i in self.identities]
        if self.unsafe_replica_deltas:
            parts.append("UNSAFE: cache deltas of a replica's own bytes (unsafe_replica_deltas)")
        return "; ".join(parts)

    @classmethod
    def from_mapping(cls, data: Any, *, source: str | Source, base_dir: Path | None = None) -> VerifyPolicy:
        """Validate a parsed ``verify:`` section. ``source`` is the file (with line numbers) or a
        name for messages. Relative paths resolve against ``base_dir`` (default: the working
        directory)."""
        src = (source if isinstance(source, Source) else Source(source)).with_error(PolicyError)
        data = src.mapping(data, "", _FIELDS)
        base = base_dir or Path.cwd()
        identities = tuple(
            _identity(src, f"identities[{i}]", item)
            for i, item in enumerate(src.optional_list(data.get("identities"), "identities"))
        )
        keys = tuple(
            _key(src, f"keys[{i}]", item, base)
            for i, item in enumerate(src.optional_list(data.get("keys"), "keys"))
        )
        trusted_root = data.get("trusted_root")
        if trusted_root is not None:
            trusted_root = _trusted_root(src, trusted_root, base)
        require = src.boolean(data.get("require_attestation", True), "require_attestation")
        unsafe = src.boolean(data.get("unsafe_replica_deltas", False), "unsafe_replica_deltas")
        return cls(
            identities=identities,
            keys=keys,
            trusted_root=trusted_root,
            require_attestation=require,
            unsafe_replica_deltas=unsafe,
            source=src.where(),
        )


def _identity(src: Source, field: str, item: Any) -> IdentityRule:
    item = src.mapping(item, field, _IDENTITY_FIELDS)
    values = {}
    for name in _IDENTITY_FIELDS:
        value = item.get(name)
        if value is not None and not isinstance(value, str):
            raise src.error(f"{field}.{name}", f"expected a string, got {quoted(value)}")
        values[name] = value
    return IdentityRule(where=src.where(field), **values)


def _key(src: Source, field: str, item: Any, base: Path) -> PublicKey:
    if isinstance(item, Mapping):
        unknown = [n for n in item if n not in ("path", "pem")]
        if unknown or len(item) != 1:
            raise src.error(field, "expected a path string, inline PEM, or one of path:/pem:")
        item = item.get("path") or item.get("pem")
    if not isinstance(item, str) or not item.strip():
        raise src.error(field, "expected a public key path or inline PEM")
    where = src.where(field)
    try:
        if item.lstrip().startswith("-----BEGIN"):
            return load_public_key(item.encode(), source=where)
        return load_public_key_file(base / item)
    except BadInput as exc:
        raise src.error(field, str(exc)) from None


def _trusted_root(src: Source, value: Any, base: Path) -> str:
    if not isinstance(value, str) or not value:
        raise src.error("trusted_root", f"expected a path to trusted_root.json or {PUBLIC_GOOD!r}")
    if value == PUBLIC_GOOD:
        return value
    path = base / value
    try:
        doc = jsondoc.loads(read_text(path, "the trusted root", error=PolicyError))
    except PolicyError as exc:
        raise src.error("trusted_root", str(exc)) from None
    except (ValueError, RecursionError):
        raise src.error("trusted_root", f"{path} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("mediaType") != TRUSTED_ROOT_MEDIA_TYPE:
        raise src.error("trusted_root", f"{path} is not a Sigstore trusted root ({TRUSTED_ROOT_MEDIA_TYPE})")
    return str(path)


def load_policy(path: str | Path) -> VerifyPolicy:
    """A policy file: either the ``verify:`` section itself, or a document holding one."""
    p = Path(path)
    data, src = load_yaml(p, what="policy", error_type=PolicyError)
    if isinstance(data, Mapping) and "verify" in data:
        data, src = data["verify"], src.child("verify")
    return VerifyPolicy.from_mapping(data, source=src, base_dir=p.parent)
