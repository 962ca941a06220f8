#!/usr/bin/env bash
# Device call 3: assemble vLLM 0.26 from the three parts (1 and 2 moved to /root/stash by the
# two calls before), then start one run of bench/vllm_image_flow.py in its own session (it
# outlives this call): the FP8 MoE in full (compile, cold start + request mix, baked start +
# request mix), then the two earlier models baked only (compile, baked start + request mix).
# collect.sh (the calls after) waits and brings back what exists.
set -u
mkdir -p /root/stash && mv .gpu/bundle/part3 /root/stash/
bash /root/stash/part3/install.sh /root/stash /tmp/site > /root/install.log 2>&1; tail -3 /root/install.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> /root/install.log
echo "install done at ${SECONDS}s"
rm -rf /root/flow && mkdir -p /root/flow/out && cp -r .gpu/tree /root/flow/tree
cd /root/flow/tree
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
MOE_ARGS="--load-format dummy --gpu-memory-utilization 0.5 --kv-cache-memory-bytes 4294967296 --seed 0"
setsid nohup bash -c "python3 bench/vllm_image_flow.py \
  --context ctx/qwen3-30b-a3b-fp8-dummy-h200/context \
  --context ctx/tiny-llama-ref-h200/context --context ctx/qwen3-8b-dummy-h200/context \
  --serve-args-for 'qwen3-30b-a3b-fp8-dummy=$MOE_ARGS' \
  --baked-only tiny-llama-ref --baked-only qwen3-8b-dummy --skip-checks \
  --target qwen3-30b-a3b-fp8-dummy=6 --mix-total 200 --deadline ${DEADLINE:-1200} \
  --out /root/flow/out > /root/flow/out/stdout.log 2>&1; echo \$? > /root/flow/done" \
  < /dev/null > /dev/null 2>&1 &
echo "bench started at ${SECONDS}s"
bash bench/results/vllm-0.26.0-h200-moe/collect.sh "${WAIT:-420}"
