"""The registry client's tests push kernelbake-shaped, signed images: they share the signing
tests' fixtures (key pairs, the client, ``make_image`` on the real registry)."""

from tests.signing.conftest import client, image_registry, keys, make_image, settings

__all__ = ["client", "image_registry", "keys", "make_image", "settings"]
