"""Sign, attest and verify kernelbake images with Sigstore, stored the way cosign writes them.

The public surface is ``__all__`` below; everything else (``discover``, ``trust``, ``intoto``,
``formats``, ``_internal``) is how it is done, used by these modules and their tests only.
"""

from kernelbake.signing.errors import VerificationFailed, registry_errors
from kernelbake.signing.index import IndexVerification, read_subject, verify_index
from kernelbake.signing.keys import generate_key_pair, load_public_key_file
from kernelbake.signing.policy import VerifyPolicy, load_policy
from kernelbake.signing.sign import SignResult, sign_image
from kernelbake.signing.signer import KeySigner, Signer, signer_from_settings
from kernelbake.signing.verify import VerifiedImage, VerifiedSignature, verify_image, verify_signature

__all__ = [
    "IndexVerification",
    "KeySigner",
    "SignResult",
    "Signer",
    "VerificationFailed",
    "VerifiedImage",
    "VerifiedSignature",
    "VerifyPolicy",
    "generate_key_pair",
    "load_policy",
    "load_public_key_file",
    "read_subject",
    "registry_errors",
    "sign_image",
    "signer_from_settings",
    "verify_image",
    "verify_index",
    "verify_signature",
]
