"""Admission: a Kubernetes webhook that admits only signed kernel-cache images, pinned to the
digest that was verified, on nodes whose GPU the image was baked for.

What it denies is one table: ``rules.RULES`` (docs/admission.md, "What admission denies").
Data flows one way, down the layers pyproject.toml's contracts hold: ``http`` (the HTTPS
server) → ``service`` (one review from document to answer; ``kernelbake admission review``
shares it) → ``admit.plan`` (pure: the pod walked once, which images are governed) → the
``gateway`` (the only I/O: verification, cached per digest) → ``admit.decide`` (pure: every rule
on the same facts, and the JSONPatch) → the answer.
"""
