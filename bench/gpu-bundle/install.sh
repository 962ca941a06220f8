#!/usr/bin/env bash
# On the device: the site directory bench/gpu-bundle.sh packed, from the pieces in STASH, into
# TARGET. Stops, naming what is wrong, when a piece is missing or the joined stream's digest is
# not bundle.json's (a chunk not stashed on this machine, or cut short in transit).
#   bash STASH/install.sh STASH TARGET
set -euo pipefail
stash=${1:?usage: install.sh STASH TARGET}; target=${2:?usage: install.sh STASH TARGET}
manifest=$stash/bundle.json
want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pieces"])' "$manifest")
have=$(find "$stash" -maxdepth 1 -name 'site.tar.xz.[0-9][0-9]' | wc -l)
if [ "$have" != "$want" ]; then
  echo "install.sh: $have of $want pieces in $stash: stash every chunk on this machine first" >&2
  exit 1
fi
digest=$(cat "$stash"/site.tar.xz.[0-9][0-9] | sha256sum | cut -d' ' -f1)
expected=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sha256"])' "$manifest")
if [ "$digest" != "$expected" ]; then
  echo "install.sh: the joined pieces have sha256 $digest, bundle.json says $expected: stash the chunks again" >&2
  exit 1
fi
rm -rf "$target" && mkdir -p "$target"
cat "$stash"/site.tar.xz.[0-9][0-9] | xz -d -T0 | tar -x -C "$target"
echo "install.sh: $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["release"], d["versions"])' "$manifest") in $target"
