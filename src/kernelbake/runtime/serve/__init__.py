"""The serve room: what runs when the image starts. ``preflight`` decides whether the baked
caches are used (a ``decision.Decision``, warm or cold with its reasons) and places them,
merging a verified cache delta (``delta``); ``start`` (``kernelbake serve``) starts the engine
behind it; ``check`` asks the engine's own prediction without serving. Imports nothing of the
compile or capture rooms."""
