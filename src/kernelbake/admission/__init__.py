"""Admission: a Kubernetes webhook that admits only signed kernel-cache images, pinned to the
digest that was verified, on nodes whose GPU the image was baked for.

Data flows one way: AdmissionReview document → ``review.parse_review`` → ``admit.plan`` (pure:
which containers run governed images) → ``gateway`` (the only I/O: verification, cached per
digest) → ``admit.decide`` (pure: signatures, GPU matching, JSONPatch) → response document.
The HTTPS server (``server``) and ``kernelbake admission review`` share all of it.
"""
