"""For your own scripts in a torch image: the preflight ``serve`` runs, then this process
pointed at the caches it chose, so that your own ``torch.compile`` of the baked model and
shapes loads the baked graphs and kernels.

It lives with ``serve`` rather than with the torch engine because it runs the preflight: the
engines sit below ``serve`` and never call it back.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from kernelbake.runtime import env as runtime_env
from kernelbake.runtime.engines.torch_engine import TorchEngine
from kernelbake.runtime.env import RuntimeEnv
from kernelbake.runtime.serve.preflight import Verdict, preflight


def use_baked_caches(user_args: Sequence[str] = ()) -> Verdict:
    """Run the preflight and point this process at the caches it chose (the baked ones when
    they fit, else a fresh directory).

    Call it before importing torch: Inductor reads some of these variables at import.
    """
    verdict = preflight(RuntimeEnv.from_env(), user_args, engine=TorchEngine())
    for line in verdict.lines():
        print(f"kernelbake: {line}", file=sys.stderr, flush=True)
    runtime_env.apply(verdict.env)
    return verdict
