"""The compile room: what runs in the image's build stage. ``fetch`` gets the model's config
and tokenizer, ``stage`` (``kernelbake compile``) runs the engine's warm-up and writes the
cache bundle with its manifest. Nothing here runs when the image serves."""
