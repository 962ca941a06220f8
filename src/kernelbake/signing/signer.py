"""Signers: something that turns an in-toto statement into a Sigstore bundle, and a payload into
a legacy cosign signature. ``KeySigner`` signs with a local ECDSA P-256 key (no transparency
log, a public-key hint in the bundle); ``KeylessSigner`` signs with a Fulcio certificate and a
Rekor entry through sigstore-python (``kernelbake.signing._internal.keyless``, imported only
when used)."""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from kernelbake.errors import BadInput
from kernelbake.settings import Settings
from kernelbake.signing.errors import TokenMissing
from kernelbake.signing.formats import ANN_VOUCH_KEY, ANN_VOUCH_SIGNATURE, BUNDLE_V03
from kernelbake.signing.intoto import PAYLOAD_TYPE, Envelope
from kernelbake.signing.keys import PrivateKey, PublicKey, load_private_key
from kernelbake.textfile import read_text

if TYPE_CHECKING:
    from sigstore.models import ClientTrustConfig


@dataclasses.dataclass(frozen=True)
class SignedStatement:
    bundle: bytes  # Sigstore bundle JSON (DSSE envelope + verification material)
    envelope: bytes  # the DSSE envelope alone, for the legacy .att layer
    # Legacy-format annotations carrying the verification material (keyless: cert, chain, SET).
    legacy_annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LegacySignature:
    signature: str  # base64 of the signature over the payload bytes
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)


class Signer(Protocol):
    @property
    def identity(self) -> str: ...

    @property
    def public_key(self) -> PublicKey | None:
        """The key whose existing signatures make signing again unnecessary; None: always sign."""
        ...

    def sign_statement(self, statement: bytes) -> SignedStatement: ...

    def sign_payload(self, payload: bytes) -> LegacySignature: ...

    def vouch(self, payload: bytes, bundle: bytes) -> Mapping[str, str]:
        """The vouch annotations (``formats.ANN_VOUCH_*``, the layer digest aside) for ``bundle``,
        this signer's: who signed, and a signature over ``payload``; nothing logged anywhere."""
        ...


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


class KeySigner:
    """Key-based signing for air-gapped builders: nothing leaves the machine."""

    def __init__(self, key: PrivateKey) -> None:
        self._key = key

    @property
    def identity(self) -> str:
        return f"key {self._key.public.fingerprint}"

    @property
    def public_key(self) -> PublicKey:
        return self._key.public

    def sign_statement(self, statement: bytes) -> SignedStatement:
        envelope = Envelope(PAYLOAD_TYPE, statement, ())
        envelope = dataclasses.replace(envelope, signatures=(self._key.sign(envelope.pae()),))
        env_doc = envelope.to_json()
        bundle = {
            "mediaType": BUNDLE_V03,
            "verificationMaterial": {"publicKey": {"hint": self._key.public.hint}},
            "dsseEnvelope": env_doc,
        }
        return SignedStatement(bundle=_json(bundle), envelope=_json(env_doc))

    def sign_payload(self, payload: bytes) -> LegacySignature:
        return LegacySignature(base64.b64encode(self._key.sign(payload)).decode())

    def vouch(self, payload: bytes, bundle: bytes) -> Mapping[str, str]:
        return {
            ANN_VOUCH_KEY: self._key.public.hint,
            ANN_VOUCH_SIGNATURE: base64.b64encode(self._key.sign(payload)).decode(),
        }


class KeylessSigner:
    """Keyless signing for CI: a short-lived Fulcio certificate for the token's identity (one per
    signer, reused while valid), every signature logged in Rekor."""

    def __init__(self, trust_config: ClientTrustConfig, token: str) -> None:
        from kernelbake.signing._internal.keyless import KeylessSession

        self._session = KeylessSession(trust_config, token)

    @property
    def identity(self) -> str:
        return self._session.identity

    @property
    def public_key(self) -> None:
        # Never skipped: a keyless signature is a new certificate and a new transparency-log
        # entry (when, by which CI run); telling "the same identity" apart would need the
        # verifier's trust root and identity policy here, which signing does not have.
        return None

    def sign_statement(self, statement: bytes) -> SignedStatement:
        bundle, envelope, annotations = self._session.sign_statement(statement)
        return SignedStatement(bundle, envelope, annotations)

    def sign_payload(self, payload: bytes) -> LegacySignature:
        signature, annotations = self._session.sign_payload(payload)
        return LegacySignature(signature, annotations)

    def vouch(self, payload: bytes, bundle: bytes) -> Mapping[str, str]:
        return self._session.vouch(payload, bundle)


# -- choosing a signer from settings (CLI, `make image`, the build driver) -----------------


def local_key_path(settings: Settings) -> Path:
    """$KERNELBAKE_SIGNING_KEY, else the key `make image` generates under the build dir."""
    return settings.signing_key or settings.build_dir / "signing" / "kernelbake.key"


def identity_token(settings: Settings, token_file: Path | None = None) -> str:
    """The OIDC token for keyless signing: a file, $KERNELBAKE_OIDC_TOKEN/$SIGSTORE_ID_TOKEN, a
    token file from settings, or ambient CI credentials (GitHub Actions, GitLab, GCP, …)."""
    path = token_file or settings.oidc_token_file
    if path:
        text = read_text(path, "identity token").strip()
        if not text:
            raise BadInput(f"{path}: the identity token file is empty")
        return text
    if settings.oidc_token:
        return settings.oidc_token
    from sigstore.oidc import IdentityError, detect_credential

    try:
        token = detect_credential()
    except IdentityError as exc:
        raise TokenMissing(f"keyless signing: ambient credential detection failed: {exc}") from None
    if not token:
        raise TokenMissing(
            "keyless signing needs an OIDC identity token",
            hint="set KERNELBAKE_OIDC_TOKEN (or SIGSTORE_ID_TOKEN), --identity-token-file, "
            "or run in CI with id-token access",
        )
    return token


def signer_from_settings(
    settings: Settings,
    *,
    keyless: bool = False,
    key: Path | None = None,
    trust_config: str | None = None,
    token_file: Path | None = None,
) -> Signer:
    """Keyless (Fulcio + Rekor per the trust config) or key-based (``key``, else the local key)."""
    if keyless:
        from kernelbake.signing._internal.keyless import check_token, load_trust_config

        token = identity_token(settings, token_file)
        check_token(token)  # a bad token fails before any trust material is fetched
        return KeylessSigner(load_trust_config(trust_config or settings.trust_config), token)
    # A missing key, a dangling link, a loop or a directory: load_private_key says which.
    return KeySigner(load_private_key(key or local_key_path(settings), settings.signing_key_password))
