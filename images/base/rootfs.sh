#!/usr/bin/env bash
# Import a debootstrap'd Debian 12 rootfs (python3, pip, g++ and the Python headers) as
# $ROOTFS_IMAGE, once: every CPU base image starts from it, since no image can be pulled from
# a public registry here. Inductor needs g++ and the headers at compile time and on a cold start.
set -euo pipefail
ROOTFS_IMAGE=${ROOTFS_IMAGE:-kernelbake/debian-rootfs:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
LOG=${LOG:-.cache/debootstrap.log}

if docker image inspect "$ROOTFS_IMAGE" >/dev/null 2>&1; then
  exit 0
fi
mkdir -p "$(dirname "$LOG")"
rootfs=$(mktemp -d /tmp/kernelbake-rootfs.XXXXXX)
echo "rootfs: debootstrap bookworm into $rootfs"
debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates,g++,python3-dev \
  bookworm "$rootfs" "$MIRROR" > "$LOG" 2>&1 \
  || { echo "rootfs: debootstrap failed; see $LOG" >&2; exit 4; }
tar -C "$rootfs" -c . | docker import - "$ROOTFS_IMAGE"
rm -rf "$rootfs"
