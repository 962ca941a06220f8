"""The bake: the bake file each build runs (``bakefile``)."""
