"""Sign, attest and verify kernelbake images with Sigstore, stored the way cosign writes them.

Public modules: ``policy`` (VerifyPolicy, load_policy), ``verify`` (verify_image),
``sign`` (sign_image), ``signer`` (KeySigner), ``keys`` (key pairs), ``errors``.
"""
