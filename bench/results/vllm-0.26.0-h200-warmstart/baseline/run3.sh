#!/usr/bin/env bash
# Device call 3: assemble vLLM 0.26, then the image flow for both models, one after the other.
set -u
mkdir -p /root/stash && mv .gpu/bundle/part3 /root/stash/
bash /root/stash/part3/install.sh /root/stash /tmp/site > $OUT/install.log 2>&1; tail -3 $OUT/install.log
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
cd .gpu/ws
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $OUT/install.log
echo "install done at ${SECONDS}s"
left=$((575 - SECONDS))
for m in tiny-llama-ref qwen3-8b-dummy; do
  if [ $m = tiny-llama-ref ]; then d=$(( (left - 20) / 2 )); else d=$((570 - SECONDS)); fi
  echo "== $m deadline ${d}s at ${SECONDS}s"
  mkdir -p $OUT/$m
  timeout $((d + 25)) python3 bench/vllm_image_flow.py --context build/gpu-flow/$m-h200/context --out $OUT/$m --deadline $d > $OUT/$m/stdout.log 2>&1 || echo "$m rc=$?"
  cp $OUT/$m/stdout.log $OUT/$m/logs/ 2>/dev/null
  tar czf $OUT/$m-logs.tar.gz -C $OUT/$m logs 2>/dev/null
  [ -f $OUT/$m/vllm-image-flow.json ] && mv $OUT/$m/vllm-image-flow.json $OUT/$m.json
  tail -40 $OUT/$m/stdout.log
  rm -rf $OUT/$m
done
echo "all done at ${SECONDS}s"
