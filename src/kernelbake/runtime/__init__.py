"""Code that runs inside images: the compile stage, the runtime preflight and ``serve``.

Imports of torch or an engine happen inside functions, so ``kernelbake check`` can report a
broken engine install instead of failing to import.
"""
