"""Publishing what ``kernelbake.bake`` built: the image pushed (or the digest its container
builder pushed), the cache-only artifact built from the compiled caches and pushed, and the
model's variant index over what was pushed. Signing is ``kernelbake.signing``, run on the
pushed digests."""
