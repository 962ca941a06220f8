"""Code that runs inside images, in three rooms that never import each other: ``compile``
(the build stage), ``serve`` (the preflight, ``serve`` and ``check``) and ``capture`` (what a
replica compiled after its build). Beneath them: process ``snapshot``s (restored by serve),
the ``engines``, and the modules all of them share (the environment, the bundle on disk and
what vouches for it, the cache gate, the engine's prediction, secrets redacted).

Imports of torch or an engine happen inside functions, so ``kernelbake check`` can report a
broken engine install instead of failing to import.
"""
