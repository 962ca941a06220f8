"""The image contract: what the host and the code inside an image agree on.

The compatibility key and its labels, the serve arguments, ``target.json``, the cache bundle's
layout and manifest, and the rule that judges a key against a platform. Host code and image
code (``kernelbake.runtime``) both import this package and never each other; this package
imports nothing of kernelbake's but ``kernelbake.errors`` (see docs/architecture.md).
"""
