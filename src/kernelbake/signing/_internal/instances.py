"""Names of the public Sigstore instances, whose trust material sigstore-python fetches through TUF.

A leaf module: the policy (public layer) and the keyless client (internal) both need the names,
and internal modules never import the public layer.
"""

from __future__ import annotations

PUBLIC_GOOD = "sigstore-public-good"
STAGING = "sigstore-staging"
