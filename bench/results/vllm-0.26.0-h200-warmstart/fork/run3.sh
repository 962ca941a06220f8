#!/usr/bin/env bash
# Device call 3 (warmstart helper): vLLM 0.26, then the image flow for the reference model, with
# one more baked start under vLLM's own default for `vllm serve` (spawn) to compare.
set -u
mkdir -p /root/stash && mv .gpu/bundle/part3 /root/stash/
bash /root/stash/part3/install.sh /root/stash /tmp/site > $OUT/install.log 2>&1; tail -3 $OUT/install.log
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cd .gpu/ws-warmstart
m=tiny-llama-ref; d=$(( ${1:-395} - 20 - SECONDS )); mkdir -p $OUT/$m
echo "== $m deadline ${d}s at ${SECONDS}s"
timeout $((d + 15)) python3 bench/vllm_image_flow.py --context build/gpu-flow/$m-h200/context --out $OUT/$m \
  --deadline $d --also-env VLLM_WORKER_MULTIPROC_METHOD=spawn > $OUT/$m/stdout.log 2>&1 || echo "$m rc=$?"
cp $OUT/$m/stdout.log $OUT/$m/logs/ 2>/dev/null
tar czf $OUT/$m-logs.tar.gz -C $OUT/$m logs 2>/dev/null
[ -f $OUT/$m/vllm-image-flow.json ] && mv $OUT/$m/vllm-image-flow.json $OUT/$m.json
tail -60 $OUT/$m/stdout.log
rm -rf $OUT/$m
echo "all done at ${SECONDS}s"
