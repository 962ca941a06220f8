#!/usr/bin/env bash
# Device calls after run3.sh: wait up to $1 seconds for the run, then copy what exists to
# $OUT (the JSON, stdout, the install log, one tarball of every model's logs), and show the
# state. Everything not copied is lost when the lease ends.
set -u
limit=${1:-540}
while [ ! -f /root/flow/done ] && [ $SECONDS -lt "$limit" ]; do sleep 5; done
echo "waited ${SECONDS}s; done=$(cat /root/flow/done 2>/dev/null)"
cd /root/flow/out || exit 1
cp vllm-image-flow.json stdout.log $OUT/ 2>/dev/null
cp /root/install.log $OUT/ 2>/dev/null
tar czf $OUT/logs.tar.gz --exclude='*.so' */logs 2>/dev/null
ls -la $OUT
nvidia-smi --query-gpu=memory.used --format=csv,noheader
for m in */; do echo "== $m"; ls ${m}logs | tail -4; done
grep -h "speedup_ready\|ready_s\"\|files_added_after_ready\"" vllm-image-flow.json 2>/dev/null | head -12
tail -15 stdout.log
for f in */logs/compile-*.log; do echo "== $f"; tail -4 "$f"; done 2>/dev/null
