"""Loads bench/autotune_probe.py into every Python process of a start whose PYTHONPATH names
this directory first (a diagnostic baked start: see that module). It shadows the interpreter's
own sitecustomize, if any, for that start only."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import autotune_probe

autotune_probe.install()
