"""bench/autotune_probe.py, off the GPU: it wraps Inductor's autotuner when torch imports it,
and its lines say what decides a benchmark at start (static or not, configs and launchers, the
cache state, the configs hash of the compile results against the baked file's, the file's bytes
before and after). Run on a stand-in module with the names and shapes the probe reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

FAKE = '''
import json
from pathlib import Path

def hash_configs(configs):
    return "h" + str(len(configs))

class Cfg:
    def __init__(self, n):
        self.n = n

class Result:
    def __init__(self, n):
        self.config = Cfg(n)

class Cache:
    def __init__(self, path):
        self.local_cache = (None, path)
        self.configs_hash = "h3"

    def save(self, config, taken):
        Path(self.local_cache[1]).write_text(json.dumps({"configs_hash": self.configs_hash, "time_taken_ms": taken}))

class CachingAutotuner:
    """A static autotuner pruned to its winner, as pickled at build, with the build's hook."""

    def __init__(self, path):
        self.compile_results = [Result(1)]
        self.launchers = []
        self.filename = "/cache/jd/k.py"
        self.inductor_meta = {"kernel_name": "triton_red_fused_0"}
        self.heuristic_type = "REDUCTION"
        self.autotune_cache_info = {}
        self.save_cache_hook = Cache(path).save

    def is_statically_launchable(self):
        return True

    def recheck_autotune_cache(self, reload_kernel_from_src):
        self.autotune_cache_info = {"autotune_cache_state": "only 1 config"}

    def _dynamic_scale_rblock(self):
        self.compile_results.append(Result(2))
        self.launchers = [1, 2]

    def autotune_to_one_config(self, *args):
        self.launchers = [1]
        self.save_cache_hook(None, 7)
'''

START = """
import json, sys
from pathlib import Path
import autotune_probe
autotune_probe.install("kb_fake_heuristics")
import kb_fake_heuristics as th
best = Path(sys.argv[1])
best.write_text(json.dumps({"configs_hash": "h3", "time_taken_ms": 5}))
t = th.CachingAutotuner(str(best))
t.recheck_autotune_cache(None)
t._dynamic_scale_rblock()
t.autotune_to_one_config()
"""


def _events(stderr: str) -> list[dict[str, object]]:
    mark = "kernelbake-autotune-probe "
    return [json.loads(line[len(mark) :]) for line in stderr.splitlines() if line.startswith(mark)]


def test_the_probe_says_why_a_baked_kernel_is_benchmarked_again(tmp_path: Path) -> None:
    (tmp_path / "kb_fake_heuristics.py").write_text(FAKE)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'bench'}:{tmp_path}"}
    res = subprocess.run(
        [sys.executable, "-c", START, str(tmp_path / "k.best_config")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    events = _events(res.stderr)
    assert [e["event"] for e in events] == [
        "patched",
        "recheck_autotune_cache",
        "_dynamic_scale_rblock",
        "autotune_to_one_config",
    ]
    recheck, dsr, tune = events[1:]
    # One compile result whose configs hash is not the baked file's: the cache is not read.
    assert recheck["after"]["cache_state"] == "only 1 config"  # type: ignore[index]
    assert recheck["after"]["stored_configs_hash"] == "h3"  # type: ignore[index]
    assert recheck["after"]["results_configs_hash"] == "h1"  # type: ignore[index]
    assert recheck["after"]["static"] is True and recheck["rewritten"] is False  # type: ignore[index]
    assert (dsr["before"]["compile_results"], dsr["after"]["compile_results"]) == (1, 2)  # type: ignore[index]
    assert tune["rewritten"] is True and tune["before"]["launchers"] == 2  # type: ignore[index]
    assert json.loads(str(tune["file_after"]))["time_taken_ms"] == 7
    assert tune["after"]["best_config_file"] == str(tmp_path / "k.best_config")  # type: ignore[index]


def test_the_site_directory_installs_the_probe_without_importing_torch() -> None:
    code = "import sys, autotune_probe; print('torch' in sys.modules, [type(f).__name__ for f in sys.meta_path][0])"
    env = {**os.environ, "PYTHONPATH": str(REPO / "bench" / "autotune_probe_site")}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "_Finder"]
