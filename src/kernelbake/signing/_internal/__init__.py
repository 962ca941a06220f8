"""Sigstore service plumbing (sigstore-python, certificates); not a public API."""
