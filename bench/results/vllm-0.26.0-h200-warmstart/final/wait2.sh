#!/usr/bin/env bash
# Device call 5 of 5: wait for the key matrix that call 3's session runs after the flow, then
# bring back its JSON, identities and logs.
set -u
while [ ! -f /root/flow/done2 ] && [ $SECONDS -lt 560 ]; do sleep 5; done
echo "waited ${SECONDS}s; done2=$(cat /root/flow/done2 2>/dev/null)"
cp /root/flow/km/*.json /root/flow/km/*.tar.gz /root/flow/km/stdout.log $OUT/ 2>/dev/null
ls -la $OUT
tail -40 /root/flow/km/stdout.log
