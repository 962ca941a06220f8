"""The identity a Fulcio certificate vouches for: OIDC issuer extension + SAN values."""

from __future__ import annotations

from cryptography import x509
from cryptography.x509.oid import ObjectIdentifier

# Fulcio's issuer extensions: v2 holds a DER UTF8String, v1 (deprecated) the raw bytes.
ISSUER_V2 = ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
ISSUER_V1 = ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
OTHERNAME_SAN = ObjectIdentifier("1.3.6.1.4.1.57264.1.7")


def _der_utf8(data: bytes) -> str | None:
    if len(data) < 2 or data[0] != 0x0C:
        return None
    length, offset = data[1], 2
    if length & 0x80:
        n = length & 0x7F
        length, offset = int.from_bytes(data[2 : 2 + n], "big"), 2 + n
    body = data[offset : offset + length]
    if len(body) != length:
        return None
    try:
        return body.decode()
    except UnicodeDecodeError:
        return None


def _extension(cert: x509.Certificate, oid: ObjectIdentifier) -> bytes | None:
    try:
        value = cert.extensions.get_extension_for_oid(oid).value
    except x509.ExtensionNotFound:
        return None
    return value.value if isinstance(value, x509.UnrecognizedExtension) else None


def issuer(cert: x509.Certificate) -> str:
    v2 = _extension(cert, ISSUER_V2)
    if v2 is not None:
        decoded = _der_utf8(v2)
        if decoded is not None:
            return decoded
    v1 = _extension(cert, ISSUER_V1)
    if v1 is not None:
        try:
            return v1.decode()
        except UnicodeDecodeError:
            pass
    return ""


def subjects(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    out: list[str] = list(san.get_values_for_type(x509.UniformResourceIdentifier))
    out += san.get_values_for_type(x509.RFC822Name)
    for other in san.get_values_for_type(x509.OtherName):
        if other.type_id == OTHERNAME_SAN:
            out.append(_der_utf8(other.value) or other.value.decode("utf-8", "replace"))
    return out


def describe(cert: x509.Certificate) -> str:
    return f"{', '.join(subjects(cert)) or '(no SAN)'} (issuer {issuer(cert) or 'unknown'})"
