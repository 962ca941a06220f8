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


def test_the_nearest_release_is_the_closest_minor_and_on_a_tie_the_older() -> None:
    from kernelbake.contract.engines import nearest_release

    listed = ["0.26.0", "0.32.0", "0.34.0"]
    assert nearest_release("0.33.0", listed) == "0.32.0"
    assert nearest_release("0.35.1", listed) == "0.34.0"
    assert nearest_release("0.30.0", listed) == "0.32.0"
    assert nearest_release("0.26.1", listed) == "0.26.0"
    assert nearest_release("1.0.0", listed) == "0.34.0"
    # Not a release number at all: still an answer, never a traceback.
    assert nearest_release("main", listed) == "0.26.0"
    assert nearest_release("0.33.0", []) == "none"


def test_an_unadapted_release_names_the_adapted_ones_and_the_nearest() -> None:
    from kernelbake.contract.engines import Build

    assert VLLM.adapter("0.33.0", Build.CUDA) == "none"
    assert VLLM.nearest_adapted("0.33.0", Build.CUDA) == "0.32.0"
    assert VLLM.nearest_adapted("0.26.0", Build.CPU) == "0.32.0"
