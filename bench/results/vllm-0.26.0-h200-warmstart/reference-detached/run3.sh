#!/usr/bin/env bash
# Device call 3 of 3 (second run of the session): vLLM 0.26 assembled, then one run of
# bench/vllm_image_flow.py for the reference model only (the device time left holds no more).
set -u
mkdir -p /root/stash && mv .gpu/bundle/part3 /root/stash/
bash /root/stash/part3/install.sh /root/stash /tmp/site > $OUT/install.log 2>&1; tail -3 $OUT/install.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $OUT/install.log
echo "install done at ${SECONDS}s"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
mkdir -p $OUT/run
timeout 540 python3 bench/vllm_image_flow.py --context .gpu/flow/ctx/tiny-llama-ref-h200/context \
  --target tiny-llama-ref=6 --deadline 520 --out $OUT/run > $OUT/stdout.log 2>&1; echo "bench rc=$?"
mv $OUT/run/vllm-image-flow.json $OUT/ 2>/dev/null
tar czf $OUT/tiny-llama-ref-logs.tar.gz -C $OUT/run/tiny-llama-ref logs 2>/dev/null
rm -rf $OUT/run
cat $OUT/stdout.log | tail -15
echo "done at ${SECONDS}s"
