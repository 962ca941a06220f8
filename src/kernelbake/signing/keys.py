"""ECDSA P-256 keys for key-based signing (air-gapped builders).

Private keys are PKCS#8 PEM, encrypted when a password is given; public keys are SPKI PEM, the
format ``cosign verify --key`` reads. A key is named by its fingerprint, ``sha256:<hex>`` of the
DER public key; its base64 form is the ``publicKey.hint`` that cosign puts in key-signed bundles.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kernelbake.errors import BadInput
from kernelbake.textfile import read_bytes

PRIVATE_SUFFIX = ".key"
PUBLIC_SUFFIX = ".pub"
# What to do about a key file that cannot be read, said by every reader of a key path (sign
# --key, verify --key, a policy's keys:); what is wrong with the path is textfile's to say.
SIGNING_KEY_HINT = "run `kernelbake generate-key-pair` (or `make signing-key`), pass --key, or use --keyless"
PUBLIC_KEY_HINT = "name the .pub file that `kernelbake generate-key-pair` wrote beside the signing key"


def _der(public_key: ec.EllipticCurvePublicKey) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@dataclasses.dataclass(frozen=True)
class PublicKey:
    key: ec.EllipticCurvePublicKey = dataclasses.field(repr=False, compare=False)
    name: str
    fingerprint: str  # sha256:<hex> of the DER SubjectPublicKeyInfo

    @classmethod
    def of(cls, key: ec.EllipticCurvePublicKey, *, name: str) -> PublicKey:
        return cls(key, name, "sha256:" + hashlib.sha256(_der(key)).hexdigest())

    @property
    def hint(self) -> str:
        """base64 of the sha256 of the DER key, as cosign writes ``verificationMaterial.publicKey.hint``."""
        return base64.b64encode(bytes.fromhex(self.fingerprint.removeprefix("sha256:"))).decode()

    def pem(self) -> bytes:
        return self.key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def verifies(self, signature: bytes, data: bytes) -> bool:
        try:
            self.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return False
        return True


@dataclasses.dataclass(frozen=True)
class PrivateKey:
    key: ec.EllipticCurvePrivateKey = dataclasses.field(repr=False, compare=False)
    public: PublicKey

    def sign(self, data: bytes) -> bytes:
        """DER-encoded ECDSA-SHA256 signature over ``data``."""
        return self.key.sign(data, ec.ECDSA(hashes.SHA256()))


def _check_curve(key: object, source: str) -> None:
    if not isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey) or not isinstance(
        key.curve, ec.SECP256R1
    ):
        raise BadInput(f"{source}: not an ECDSA P-256 key (kernelbake signs with P-256 only)")


def load_public_key(pem: bytes, *, source: str) -> PublicKey:
    try:
        key = serialization.load_pem_public_key(pem)
    except ValueError:
        raise BadInput(f"{source}: not a PEM public key") from None
    _check_curve(key, source)
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return PublicKey.of(key, name=source)


def load_public_key_file(path: Path) -> PublicKey:
    data = read_bytes(path, "public key", hint=PUBLIC_KEY_HINT)
    return load_public_key(data, source=str(path))


def load_private_key(path: Path, password: str | None = None) -> PrivateKey:
    data = read_bytes(path, "signing key", hint=SIGNING_KEY_HINT)
    if b"ENCRYPTED SIGSTORE PRIVATE KEY" in data or b"ENCRYPTED COSIGN PRIVATE KEY" in data:
        raise BadInput(
            f"{path}: cosign's encrypted key format is not supported",
            hint="generate a key with `kernelbake generate-key-pair`, or export it as PKCS#8 PEM",
        )
    try:
        key = serialization.load_pem_private_key(data, password.encode() if password else None)
    except TypeError:
        raise BadInput(
            f"{path}: key is encrypted and no password was given",
            hint="set KERNELBAKE_SIGNING_KEY_PASSWORD (or COSIGN_PASSWORD)",
        ) from None
    except ValueError:
        raise BadInput(f"{path}: not a PEM private key, or the password is wrong") from None
    _check_curve(key, str(path))
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return PrivateKey(key, PublicKey.of(key.public_key(), name=str(path)))


def generate_key_pair(
    directory: Path, *, name: str = "kernelbake", password: str | None = None, overwrite: bool = False
) -> tuple[Path, Path]:
    """Write ``<name>.key`` (mode 0600) and ``<name>.pub`` under ``directory``; returns both paths."""
    private_path = directory / f"{name}{PRIVATE_SUFFIX}"
    public_path = directory / f"{name}{PUBLIC_SUFFIX}"
    if not overwrite and (private_path.exists() or public_path.exists()):
        raise BadInput(f"{private_path}: a key pair already exists", hint="pass --force to replace it")
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode()) if password else serialization.NoEncryption()
    )
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    public_path.write_bytes(PublicKey.of(key.public_key(), name=str(public_path)).pem())
    return private_path, public_path
