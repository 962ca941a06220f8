"""kernelbake: compiled kernels as a build output of LLM serving images."""

__version__ = "0.1.0"
