"""The ``torch`` engine: plain ``torch.compile`` (Inductor) of a transformers model.

Runs on the CPU in CI. The compile stage builds the model from its config with random
weights, compiles it on the spec's shapes and stops; the caches it leaves behind in
``TORCHINDUCTOR_CACHE_DIR`` (FX graphs, AOTAutograd entries, compiled C++ kernels) and
``TRITON_CACHE_DIR`` are the bundle. torch is imported inside methods only.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kernelbake.contract import jsondoc
from kernelbake.contract.engines import TORCH, EngineDeclaration
from kernelbake.contract.key import NONE
from kernelbake.contract.platform import Platform, Software, arch_for
from kernelbake.contract.target import TargetConfig
from kernelbake.runtime import probe
from kernelbake.runtime.engines import CompileResult
from kernelbake.runtime.env import RuntimeEnv

if TYPE_CHECKING:
    from kernelbake.runtime.prediction import Prediction


class TorchEngine:
    declaration: EngineDeclaration = TORCH

    def probe(self) -> Platform:
        import torch

        version = probe.public_version(torch.__version__)
        if torch.cuda.is_available():
            device = str(torch.cuda.get_device_name(0))
            capability = tuple(torch.cuda.get_device_capability(0))
            arch = arch_for((int(capability[0]), int(capability[1])))
            driver = probe.nvidia_driver()
        else:
            device, arch, driver = "cpu", probe.machine(), NONE
            stand_in = RuntimeEnv.from_env().unsafe_test_device
            if stand_in:
                print(
                    f"kernelbake: UNSAFE: reporting the CPU as {stand_in!r} "
                    "($KERNELBAKE_UNSAFE_TEST_DEVICE, a test stand-in for a GPU family)",
                    file=sys.stderr,
                )
                device = stand_in
        software = Software(
            engine_version=version,
            torch=version,
            triton=probe.dist_version("triton"),
            cuda=str(torch.version.cuda) if torch.version.cuda else NONE,
            flashinfer=NONE,
            python=probe.python_version(),
        )
        return Platform(software=software, arch=arch, device=device, driver=driver)

    def hashed_env_names(self) -> tuple[str, ...]:
        return self.declaration.hashed_env

    def compile(self, target: TargetConfig, root: Path) -> CompileResult:
        from kernelbake.runtime.engines.torch_model import load_and_warm

        _model, report = load_and_warm(target)
        # The compile step records the hashed variables' values itself, from its environment.
        return CompileResult(
            kinds=self.declaration.cache_kinds,
            hashed_env={},
            report={"warmup": report.to_json(), "engine_identity": inductor_identity()},
        )

    def serve_argv(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "kernelbake.runtime.engines.torch_serve",
            *target.serve.extra_args,
            *user_args,
        ]

    def holds_at_gate(self, environ: Mapping[str, str]) -> bool:
        # torch_serve waits at the gate after its imports and model construction, before the
        # first torch.compile'd call (the first time Inductor opens its cache).
        return True

    def shm_need(self, target: TargetConfig, user_args: Sequence[str], environ: Mapping[str, str]) -> None:
        # torch_serve is one process: nothing of it goes through /dev/shm.
        return None

    def predict(
        self, target: TargetConfig, user_args: Sequence[str], env: Mapping[str, str]
    ) -> Prediction | None:
        """Inductor's own factors now against the build's (device, torch and Triton keys, its
        config), and the warm-up shapes through the server's own parser."""
        import os

        from kernelbake.contract.layout import MANIFEST
        from kernelbake.runtime.prediction import Change, KindVerdict, Outcome, Prediction, Source, diff

        try:
            doc = jsondoc.loads((Path(target.cache_root) / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        baked = doc.get("compile_report", {}).get("engine_identity")
        if not isinstance(baked, dict):
            return None
        os.environ.update(env)
        changes = diff(baked, inductor_identity(), "inductor")
        changes += [
            Change("--shapes", str(list(target.shapes)), n) for n in self.shape_args(target, user_args)
        ]
        kinds = {str(f.get("kind")) for f in doc.get("files", [])}
        verdicts = tuple(
            KindVerdict(k.value, Outcome.MISS if changes else Outcome.HIT, tuple(changes))
            if k.value in kinds
            else KindVerdict(k.value, Outcome.EMPTY)
            for k in self.declaration.cache_kinds
        )
        return Prediction(Source.ENGINE, verdicts)

    def prediction_env(self, baked_root: Path) -> dict[str, str]:
        return {}

    def launch_env(self) -> dict[str, str]:
        return {}

    def snapshot_env(self) -> dict[str, str]:
        return {}

    def serve_watcher(self, cache_root: Path) -> None:
        # The torch serve helper reports Inductor's own hit counters itself.
        return None

    def shape_args(self, target: TargetConfig, user_args: Sequence[str]) -> list[str]:
        """Warm-up shapes outside the baked ones, read by the server's own parser: the baked
        shapes repeated (or a subset) compile nothing new."""
        from kernelbake.runtime.engines.torch_serve import parse_args

        try:
            shapes = parse_args(user_args).shapes
        except SystemExit:
            return ["the serve arguments do not parse"]
        new = [s for s in shapes or () if s not in set(target.shapes)]
        if not new:
            return []
        shown = ", ".join(f"{b}x{t}" for b, t in new)
        return [f"--shapes {shown} are not among the baked shapes (Dynamo decides whether they compile)"]


def inductor_identity() -> dict[str, object]:
    """What Inductor keys its caches on besides the graph: the device and CUDA (its system
    factors), torch's own source key and its config, asked of Inductor."""
    import hashlib

    from torch._inductor import config as inductor_config
    from torch._inductor.codecache import CacheBase, torch_key

    portable = inductor_config.save_config_portable()
    return {
        "system": CacheBase.get_system(),
        "torch_key": hashlib.sha256(bytes(torch_key())).hexdigest(),
        "config": {str(k): repr(v) for k, v in sorted(portable.items())},
    }


def __getattr__(name: str) -> object:
    # ``use_baked_caches`` was documented at this path until it moved to
    # ``kernelbake.runtime.serve.scripts`` on 2026-12-05 (it runs the preflight, which the
    # engines sit below). The old import fails with an ImportError that says where it went;
    # not an AttributeError, whose message ``from ... import`` would replace with a bare
    # "cannot import name". Nothing here imports serve.
    if name == "use_baked_caches":
        raise ImportError(
            f"{__name__}.use_baked_caches moved to "
            "kernelbake.runtime.serve.scripts.use_baked_caches on 2026-12-05; "
            "import it from there",
            name=__name__,
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
