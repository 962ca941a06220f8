"""The bake: each target's rendered context and the one bake file for all targets written, then
each target's stages (runtime → compile → final) run on its GPU family's lane. Nothing here runs
a push: ``kernelbake.publish`` does (a container builder pushes the image from its final stage,
when the bake file asks it to), and ``kernelbake.pipeline`` runs the one after the other."""
