"""The serve arguments that shape compiled code, as the spec gives them and ``target.json``
carries them into the image, where each engine turns them into its command line."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from collections.abc import Mapping

from kernelbake.contract.wire import EMBEDDED_JSON


class Dtype(enum.Enum):
    AUTO = "auto"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FLOAT32 = "float32"


class Quantization(enum.Enum):
    NONE = "none"
    FP8 = "fp8"
    AWQ = "awq"
    AWQ_MARLIN = "awq_marlin"
    GPTQ = "gptq"
    GPTQ_MARLIN = "gptq_marlin"
    COMPRESSED_TENSORS = "compressed-tensors"
    BITSANDBYTES = "bitsandbytes"
    MXFP4 = "mxfp4"
    MODELOPT = "modelopt"
    MODELOPT_FP4 = "modelopt_fp4"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeArgs:
    """The serve arguments that shape compiled code; all of them enter the key."""

    dtype: Dtype = Dtype.BFLOAT16
    quantization: Quantization = Quantization.NONE
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    expert_parallel_size: int = 1
    max_model_len: int = 4096
    max_num_batched_tokens: int = 8192
    # Not in vLLM's compile hash, but it sizes the buffers its Triton kernels are specialised
    # on, so compile and serve pin the same value instead of each taking a context default.
    max_num_seqs: int = 256
    # Canonical JSON (sorted keys, no spaces), so equal configs digest equally; an object in target.json.
    compilation_config: str = dataclasses.field(default="{}", metadata=EMBEDDED_JSON)
    # Engine env pinned in the image and hashed by the engine.
    env: tuple[tuple[str, str], ...] = ()
    # Arguments passed through to the engine that do not change compiled code.
    extra_args: tuple[str, ...] = ()

    @property
    def compilation_digest(self) -> str:
        return hashlib.sha256(self.compilation_config.encode()).hexdigest()[:16]

    @property
    def env_digest(self) -> str:
        return env_digest(dict(self.env))


def env_digest(env: Mapping[str, str]) -> str:
    """Digest of pinned engine env vars; computed the same way at plan time and in preflight."""
    canonical = json.dumps(sorted(env.items()), separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
