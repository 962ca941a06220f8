#!/usr/bin/env bash
# make clean / make distclean.
#
#   scripts/clean.sh BUILD SIGNING_DIR WHEELS CPU_WHEELS        # build outputs; keeps what is
#                                       # costly or unsafe to lose (listed below), and says so
#   scripts/clean.sh --all BUILD SIGNING_DIR WHEELS CPU_WHEELS  # also those, each named with its
#                                       # size before it goes
#
# Kept by a plain clean, each named with its size: the signing key (images already signed
# verify only against it; a new key makes every old verifier reject the next image), the
# storage of the registry `make image` started (it may be serving), the reference of the last
# image pushed there (`make verify` and `make bench` read it; the image is still in that
# registry), and the wheel downloads (vLLM's CPU build, ~860 MB; the torch base image's, ~240 MB).
set -euo pipefail
all=
if [ "${1:-}" = --all ]; then
  all=1
  shift
fi
USAGE="usage: clean.sh [--all] BUILD SIGNING_DIR WHEELS CPU_WHEELS"
BUILD=${1:?$USAGE}
SIGNING_DIR=${2:?$USAGE}
WHEELS=${3:?$USAGE}
CPU_WHEELS=${4:?$USAGE}
REGISTRY_DIR=$BUILD/registry

# path and what it is, for what a plain clean keeps.
kept=(
  "$SIGNING_DIR|the signing key"
  "$REGISTRY_DIR|the local registry's storage"
  "$BUILD/image.ref|the last image make image pushed, which make verify reads"
  "$BUILD/index.ref|the variant index make image pushed last (several GPUs, or --publish both)"
  "$WHEELS|the downloaded wheels of vLLM's CPU build"
  "$CPU_WHEELS|the downloaded wheels of the torch CPU base image"
)

size() { du -sh "$1" | cut -f1; }

is_kept() {
  local path entry
  path=$(realpath -m "$1")
  for entry in "${kept[@]}"; do
    [ "$path" = "$(realpath -m "${entry%%|*}")" ] && return 0
  done
  return 1
}

# Everything under a directory except the kept paths (and the directories that lead to them).
sweep() {
  local dir=$1 child entry inner
  [ -d "$dir" ] || return 0
  for child in "$dir"/* "$dir"/.[!.]*; do
    [ -e "$child" ] || continue
    is_kept "$child" && continue
    inner=
    for entry in "${kept[@]}"; do
      case "$(realpath -m "${entry%%|*}")/" in "$(realpath -m "$child")/"*) inner=1 ;; esac
    done
    if [ -n "$inner" ]; then
      sweep "$child"
    else
      # Named with its size as it goes, as distclean names what it deletes.
      echo "clean: deleted ${child#./} ($(size "$child"))"
      rm -rf "$child"
    fi
  done
}

if [ -z "$all" ]; then
  sweep "$BUILD"
  sweep .cache
  for entry in "${kept[@]}"; do
    if [ -e "${entry%%|*}" ]; then
      echo "clean: kept ${entry%%|*} (${entry#*|}, $(size "${entry%%|*}"))"
    fi
  done
  echo "clean: make distclean deletes those too"
  exit 0
fi

pidfile=$REGISTRY_DIR/registry.pid
if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  echo "distclean: stopping the registry started by make image (pid $(cat "$pidfile"))"
  kill "$(cat "$pidfile")"
fi
for entry in "${kept[@]}"; do
  path=${entry%%|*}
  if [ -e "$path" ]; then
    echo "distclean: deleting $path (${entry#*|}, $(size "$path"))"
    rm -rf "$path"
    if [ "$path" = "$SIGNING_DIR" ]; then
      echo "distclean: the next make image signs with a new key; verifiers that trust the old one reject it"
    fi
  fi
done
rm -rf "$BUILD" .cache
echo "distclean: deleted $BUILD and .cache"
