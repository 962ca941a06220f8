#!/usr/bin/env bash
# Device call 3 of 4: assemble vLLM 0.26 from the three parts, then start one run of
# bench/vllm_image_flow.py for both models in its own session (it outlives this call, which
# ends before the 10-minute limit); call 4 (wait.sh) waits for it and brings the results back.
# After the flow, the same session runs the whole key matrix (bench/vllm_keymatrix.py) with the
# same code, so the fork default and the detached prediction are checked against vLLM's hash;
# call 5 (wait2.sh) brings that back.
set -u
mkdir -p /root/stash && mv .gpu/bundle/part3 /root/stash/
bash /root/stash/part3/install.sh /root/stash /tmp/site > /root/install.log 2>&1; tail -3 /root/install.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> /root/install.log
echo "install done at ${SECONDS}s"
rm -rf /root/flow && mkdir -p /root/flow/out && cp -r . /root/flow/tree
cd /root/flow/tree
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
setsid nohup bash -c 'python3 bench/vllm_image_flow.py \
  --context .gpu/flow/ctx/tiny-llama-ref-h200/context --context .gpu/flow/ctx/qwen3-8b-dummy-h200/context \
  --also-env VLLM_WORKER_MULTIPROC_METHOD=spawn --target tiny-llama-ref=6 --target qwen3-8b-dummy=5 \
  --importtime --deadline 1000 --out /root/flow/out > /root/flow/out/stdout.log 2>&1; echo $? > /root/flow/done
  mkdir -p /root/flow/km
  PYTHONPATH=/tmp/site:src python3 bench/vllm_keymatrix.py --out /root/flow/km --deadline 330 \
    > /root/flow/km/stdout.log 2>&1; echo $? > /root/flow/done2' \
  < /dev/null > /dev/null 2>&1 &
echo "bench started at ${SECONDS}s"
while [ ! -f /root/flow/done ] && [ $SECONDS -lt 570 ]; do sleep 5; done
echo "call 3 ends at ${SECONDS}s; done=$(cat /root/flow/done 2>/dev/null)"
grep -h '"speedup_ready"\|ready_s' /root/flow/out/vllm-image-flow.json 2>/dev/null | head -8
ls /root/flow/out /root/flow/out/*/logs 2>/dev/null | tail -30
tail -5 /root/flow/out/stdout.log
