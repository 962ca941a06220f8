"""``kernelbake fetch-model``: the model's config and tokenizer files, never its weights.

Runs in the image's build stage (the builder has network there), at the pinned revision,
into the model path that compile and serve both use.
"""

from __future__ import annotations

from pathlib import Path

from kernelbake.contract.target import TargetConfig
from kernelbake.errors import EnvironmentProblem
from kernelbake.runtime.env import RuntimeEnv

# Enough to build the model with fake weights and to tokenize; no weight files.
ALLOW_PATTERNS = (
    "*.json",
    "*.jinja",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "tokenizer*",
)
IGNORE_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.h5", "*.msgpack", "*.onnx")


def fetch_model(env: RuntimeEnv) -> Path:
    target = TargetConfig.load(env.target_file)
    key = target.key
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise EnvironmentProblem(
            "huggingface_hub is not installed in the base image; cannot fetch the model's config"
        ) from None
    dest = Path(key.model_path)
    dest.mkdir(parents=True, exist_ok=True)
    snapshot_download(
        repo_id=key.model,
        revision=key.revision,
        local_dir=str(dest),
        allow_patterns=list(ALLOW_PATTERNS),
        ignore_patterns=list(IGNORE_PATTERNS),
        token=env.hf_token,
    )
    if not (dest / "config.json").is_file():
        raise EnvironmentProblem(f"{key.model}@{key.revision}: no config.json was downloaded into {dest}")
    # snapshot_download leaves its own bookkeeping next to the files; it is not model data.
    cache = dest / ".cache"
    if cache.is_dir():
        import shutil

        shutil.rmtree(cache)
    return dest
