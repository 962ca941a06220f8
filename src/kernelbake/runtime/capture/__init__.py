"""The capture room: what a running replica compiled that its build had not. ``collect``
copies the new cache files as a delta (the replica's bytes), ``record`` keeps them as claims
with the request classes that missed, and ``replay`` sends a record's requests to the image
inside the trusted rebuild. Imports nothing of the compile or serve rooms."""
