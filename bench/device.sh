#!/usr/bin/env bash
# The one driver for bench runs on the device machine (/work/.library/device/README.md).
#
# That machine has no network and keeps nothing between leases; a call carries at most
# 64 MiB and lasts at most 10 minutes, and the machine is given back ~30 s after a call ends.
# So vLLM arrives as the three parts of shared/gpu-testenv/build-bundle.sh, one per call,
# and a run longer than one call lives in its own session, in a copy of the tree (the next
# call replaces the checkout it came from), with every call copying back what exists so far.
#
#   bench/device.sh chunk [MIB]                 here, not there: .gpu/bundle/part1..3 as chunk1..N of
#                                               at most MIB (default 40) each, big files in pieces,
#                                               so that a chunk plus the tree (bench/results
#                                               included) fits the 64 MiB a call carries
#   bench/device.sh stash PART                  calls 1 and 2: .gpu/bundle/PART to /root/stash
#                                               (a chunk: its files into the parts there)
#   bench/device.sh install                     call 3: the last part, then vLLM into /tmp/site
#                                               and this tree to /opt/kernelbake-tree; for a
#                                               bench/gpu-bundle.sh bundle (chunk1..N, its header
#                                               has the calls), the last chunk, and the bundle's
#                                               check (bench/gpu_bundle_check.py) must pass
#   bench/device.sh start NAME [--after RUN] [--private-opt] -- CMD...
#                                               CMD in a copy of this call's checkout (made again
#                                               when no run is going; refused while one uses a
#                                               copy that differs), in its own session (after RUN
#                                               ended, if given); $RUN_OUT is its output folder.
#                                               --private-opt: /opt/kernelbake, /opt/kernelbake-flow
#                                               and /models of its own (a mount namespace), so it
#                                               can share the machine with an image flow, which
#                                               owns them
#   bench/device.sh collect SECONDS [RUN...]     wait up to SECONDS (from the call's start) for the
#                                               runs (default: all) to end, then copy to $OUT one
#                                               tarball per run (its output and stdout.log, no
#                                               .so) and the install log, and show where each is
#
# Example (the contexts come from `kernelbake render SPEC --gpu h200 --out .gpu/ctx`, carried
# as .gpu/ctx with the last chunk). The tracked tree is some 16 MB now, so a 56 MiB part of
# build-bundle.sh no longer fits a call beside it: `bench/device.sh chunk 44` first (5 chunks):
#   run(carry=[".gpu/bundle/chunk1"]): bash bench/device.sh stash chunk1     (likewise 2 to 4)
#   run(carry=[".gpu/bundle/chunk5", ".gpu/ctx"]): bash bench/device.sh install &&
#       bash bench/device.sh start moe -- python3 bench/vllm_image_flow.py --context ... &&
#       bash bench/device.sh collect 540
#   run(): bash bench/device.sh collect 560           (again, until every run has ended)
set -u
# Each can be set elsewhere for tests/test_bench_device_sh.py.
RUNS=${DEVICE_RUNS:-/root/runs}
# Readable by any uid (a key-matrix case runs as uid 1000; /root is 0700).
TREE=${DEVICE_TREE:-/opt/kernelbake-tree}
STASH=${DEVICE_STASH:-/root/stash}
SITE=${DEVICE_SITE:-/tmp/site}

die() { echo "device.sh: $*" >&2; exit 2; }

stash() {
  [ -d ".gpu/bundle/$1" ] || die "no .gpu/bundle/$1 here: carry it in this call"
  mkdir -p "$STASH"
  if [ -f ".gpu/bundle/$1/CHUNK" ]; then
    rm ".gpu/bundle/$1/CHUNK"
    (cd ".gpu/bundle/$1" && find . -type f | while read -r f; do
      mkdir -p "$STASH/$(dirname "$f")" && mv "$f" "$STASH/$f"; done)
  else
    rm -rf "${STASH:?}/$1" && mv ".gpu/bundle/$1" "$STASH/"
  fi
  du -sh "$STASH"/*
}

# Here: part1..3 of build-bundle.sh repacked as chunks (each file's path kept; a file larger
# than a chunk split into NAME.piece-NN, joined again by install).
chunk() {
  local mib=${1:-40} b=.gpu/bundle
  [ -d $b/part1 ] && [ -d $b/part2 ] && [ -d $b/part3 ] || die "chunk: no $b/part1..3 (build-bundle.sh first)"
  rm -rf $b/chunk* && python3 - "$b" "$mib" <<'PY'
import os, sys
b, mib = sys.argv[1], int(sys.argv[2])
limit, piece = mib << 20, (mib << 20) // 2
items = []  # (relative path, bytes)
for part in ("part1", "part2", "part3"):
    for d, _, names in os.walk(os.path.join(b, part)):
        for n in names:
            path = os.path.join(d, n)
            rel = os.path.relpath(path, b)
            data = open(path, "rb").read()
            if len(data) <= piece:
                items.append((rel, data))
            else:
                for i in range(0, len(data), piece):
                    items.append((f"{rel}.piece-{i // piece:02d}", data[i : i + piece]))
chunks, size = [[]], 0
for rel, data in items:
    if size + len(data) > limit and chunks[-1]:
        chunks.append([])
        size = 0
    chunks[-1].append((rel, data))
    size += len(data)
for i, files in enumerate(chunks, 1):
    root = os.path.join(b, f"chunk{i}")
    for rel, data in files:
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        open(os.path.join(root, rel), "wb").write(data)
    open(os.path.join(root, "CHUNK"), "w").close()
    print(f"chunk{i}: {len(files)} files, {sum(len(d) for _, d in files) >> 20} MiB")
PY
}

# The tree the runs use: this call's checkout without the bundle (the ignored .gpu/ctx travels).
copy_tree() {
  rm -rf "$TREE" && mkdir -p "$TREE" && tar cf - --exclude=./.gpu/bundle . | tar xf - -C "$TREE"
}

# The runs that have not ended (started, or waiting for another with --after).
unfinished() {
  for d in "$RUNS"/*/; do [ -d "$d" ] && [ ! -f "$d/rc" ] && basename "$d"; done
}

install() {
  [ -d .gpu/bundle/part3 ] && stash part3 > /dev/null
  # A bench/gpu-bundle.sh bundle: its last chunk comes with this call.
  for c in .gpu/bundle/chunk*; do [ -d "$c" ] && stash "$(basename "$c")" > /dev/null; done
  if [ -f "$STASH/bundle.json" ]; then
    { bash "$STASH/install.sh" "$STASH" "$SITE" &&
      PYTHONPATH="$SITE:$PWD/src" python3 bench/gpu_bundle_check.py --bundle "$STASH/bundle.json"; } \
      > /root/install.log 2>&1 || { cp /root/install.log "$OUT/" 2>/dev/null; tail -30 /root/install.log; die "install failed"; }
  else
    find "$STASH" -name '*.piece-00' | while read -r first; do
      cat "${first%.piece-00}".piece-* > "${first%.piece-00}" && rm "${first%.piece-00}".piece-*
    done
    [ -d "$STASH/part1" ] && [ -d "$STASH/part2" ] || die "parts 1 and 2 are not in $STASH (new machine?)"
    bash "$STASH/part3/install.sh" "$STASH" "$SITE" > /root/install.log 2>&1 || { tail -20 /root/install.log; die "install failed"; }
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> /root/install.log
  copy_tree
  mkdir -p /opt/kernelbake /models "$RUNS"
  tail -2 /root/install.log
  echo "installed at ${SECONDS}s"
}

start() {
  local name=$1 after="" private=0
  shift
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case $1 in
      --after) after=$2; shift 2 ;;
      --private-opt) private=1; shift ;;
      *) die "start: unknown option $1" ;;
    esac
  done
  [ "${1:-}" = "--" ] || die "start NAME [--after RUN] [--private-opt] -- CMD..."
  shift
  [ -d "$SITE" ] || die "vLLM is not installed here: run install first"
  # install copied its own call's checkout: a context rendered again or a fix since then would
  # not reach this run (2026-12-07: a context rendered before a change, refused by the flow, cost
  # a call). With no run going the tree is this call's; with one, it must be, or start refuses.
  local going
  going=$(unfinished | paste -sd ' ' -)
  if [ -z "$going" ]; then
    copy_tree
  else
    local changed
    changed=$(diff -rq --exclude=__pycache__ --exclude=bundle . "$TREE" 2>&1 | grep -v "^Only in $TREE" | head -3)
    [ -z "$changed" ] || die "unfinished runs ($going) use $TREE, and this call's checkout differs from it ($changed): collect them first, or start with the checkout as they have it"
  fi
  local dir=$RUNS/$name
  rm -rf "$dir" && mkdir -p "$dir/out"
  printf '%q ' "$@" > "$dir/cmd"
  local body="cd $TREE && export PYTHONPATH=$SITE:$TREE/src PYTHONUNBUFFERED=1 RUN_OUT=$dir/out && $(cat "$dir/cmd")"
  if [ $private = 1 ]; then
    # /opt/kernelbake-flow too: an image flow removes its tmp-build there once its compile
    # ends, which took the TMPDIR from under another flow's compile (2026-12-02, Qwen3-8B).
    mkdir -p "$dir/opt" "$dir/models" "$dir/flow" /opt/kernelbake /models /opt/kernelbake-flow
    body="mount --bind $dir/opt /opt/kernelbake && mount --bind $dir/models /models && mount --bind $dir/flow /opt/kernelbake-flow && $body"
    body="unshare -m --propagation private bash -c $(printf '%q' "$body")"
  fi
  local wait=""
  [ -n "$after" ] && wait="while [ ! -f $RUNS/$after/rc ]; do sleep 2; done; "
  setsid nohup bash -c "${wait}date -u +%FT%TZ > $dir/started; $body > $dir/stdout.log 2>&1; echo \$? > $dir/rc" \
    < /dev/null > /dev/null 2>&1 &
  echo "started $name${after:+ (after $after)} at ${SECONDS}s"
}

collect() {
  local limit=$1
  shift
  local names=("$@")
  [ ${#names[@]} -gt 0 ] || names=($(ls "$RUNS" 2>/dev/null))
  pending() { for n in "${names[@]}"; do [ -f "$RUNS/$n/rc" ] || return 0; done; return 1; }
  while pending && [ $SECONDS -lt "$limit" ]; do sleep 5; done
  cp /root/install.log "$OUT/" 2>/dev/null
  for n in "${names[@]}"; do
    local dir=$RUNS/$n
    echo "== $n: started $(cat "$dir/started" 2>/dev/null || echo no), rc $(cat "$dir/rc" 2>/dev/null || echo running) at ${SECONDS}s"
    tar czf "$OUT/$n.tar.gz" -C "$dir" --exclude='*.so' cmd stdout.log out 2>/dev/null
    tail -n "${TAIL:-12}" "$dir/stdout.log" 2>/dev/null
  done
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  ls -la "$OUT"
}

cmd=${1:-}
shift || true
case $cmd in
  chunk) chunk "$@" ;;
  stash) stash "$@" ;;
  install) install ;;
  start) start "$@" ;;
  collect) collect "$@" ;;
  *) die "usage: device.sh chunk [MIB] | stash PART | install | start NAME [--after RUN] [--private-opt] -- CMD... | collect SECONDS [RUN...]" ;;
esac
