#!/usr/bin/env bash
# Device call 4 of 4: wait for the run call 3 started, then bring back its JSON and logs.
set -u
while [ ! -f /root/flow/done ] && [ $SECONDS -lt 560 ]; do sleep 5; done
echo "waited ${SECONDS}s; done=$(cat /root/flow/done 2>/dev/null)"
cd /root/flow/out
cp vllm-image-flow.json stdout.log $OUT/ 2>/dev/null
cp /root/install.log $OUT/
for m in */; do m=${m%/}; [ -d "$m/logs" ] && tar czf $OUT/$m-logs.tar.gz -C $m logs; done
ls -la $OUT
cat stdout.log | tail -60
