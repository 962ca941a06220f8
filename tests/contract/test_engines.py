"""Each engine's declaration: what the host renders and the image's engine code points at."""

from __future__ import annotations

from pathlib import Path

from kernelbake.contract.engines import DECLARATIONS, TORCH, VLLM
from kernelbake.contract.key import Engine
from kernelbake.contract.layout import CACHE_ROOT
from kernelbake.runtime.engines import get_engine


def test_every_engine_is_declared_and_its_runtime_uses_that_declaration() -> None:
    assert set(DECLARATIONS) == set(Engine)
    for engine, declaration in DECLARATIONS.items():
        assert declaration.engine is engine
        assert get_engine(engine).declaration is declaration


def test_every_declared_kind_has_a_variable_pointing_into_the_cache_root() -> None:
    for declaration in DECLARATIONS.values():
        root = Path(CACHE_ROOT)
        env = declaration.cache_env(root)
        pointed = {Path(v).relative_to(root).as_posix() for v in env.values() if v.startswith(f"{root}/")}
        assert pointed == {k.value for k in declaration.cache_kinds}, declaration.engine


def test_cache_env_follows_the_root_and_keeps_fixed_values() -> None:
    env = TORCH.cache_env(Path("/elsewhere"))
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere/inductor"
    assert env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] == "0"
    assert VLLM.cache_env(Path("/elsewhere"))["CUTE_DSL_CACHE_DIR"] == "/elsewhere/cute-dsl"
    # Seen on the H200 with an FP8 MoE: without it, three kernels went to $HOME at each start.
    assert VLLM.cache_env(Path("/elsewhere"))["TRTLLM_DG_CACHE_DIR"] == "/elsewhere/trtllm-deepgemm"
