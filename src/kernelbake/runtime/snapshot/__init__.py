"""Process snapshots of a baked engine: taken once (``take``), restored by ``serve`` only
through the gate (``restore``), which checks the signature's pin, the exact key and every
file before anything is restored, and falls back to the baked start otherwise."""
