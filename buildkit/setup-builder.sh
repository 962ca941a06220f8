#!/usr/bin/env bash
# Create the buildx builder kernelbake uses for one GPU family: kernelbake-<family>.
#   buildkit/setup-builder.sh hopper            # on an H100/H200 build host
#   buildkit/setup-builder.sh blackwell nvidia.com/gpu=0
# Needs: the NVIDIA driver, nvidia-container-toolkit (for `nvidia-ctk cdi generate`), Docker
# with buildx ≥ $BUILDX_MIN (buildkit/buildx.sh; make deps installs one); each is checked
# first, with one line naming what to install.
# `kernelbake build` picks the builder by the target's GPU family and refuses a GPU target
# whose builder is absent (exit 3), before it builds or pulls anything.
set -euo pipefail
FAMILY=${1:?usage: setup-builder.sh FAMILY [CDI_DEVICE]}
DEVICE=${2:-nvidia.com/gpu=all}
NAME=kernelbake-$FAMILY
IMAGE=${BUILDKIT_IMAGE:-moby/buildkit:buildx-stable-1-gpu}
HERE=$(cd "$(dirname "$0")" && pwd)
# BUILDX_MIN, BUILDX_DEBIAN, buildx_version, version_at_least: shared with scripts/deps.sh.
. "$HERE/buildx.sh"

need() { echo "setup-builder: $*" >&2; exit 3; }
INSTALL_BUILDX="make deps installs Debian sid's docker-buildx $BUILDX_DEBIAN; elsewhere install Docker's docker-buildx-plugin"

# Everything this script needs, before it changes anything.
command -v docker >/dev/null || need "docker missing (make deps installs it)"
buildx=$(buildx_version)
[ -n "$buildx" ] ||
  need "docker buildx missing or its version unreadable (docker buildx version); $BUILDX_MIN or newer is needed: $INSTALL_BUILDX"
version_at_least "$buildx" "$BUILDX_MIN" ||
  need "buildx $buildx found, $BUILDX_MIN or newer needed (RUN --device): $INSTALL_BUILDX"
command -v nvidia-ctk >/dev/null ||
  need "nvidia-ctk missing: install the NVIDIA Container Toolkit (package nvidia-container-toolkit from NVIDIA's apt repository) and the NVIDIA driver"

if [ ! -s /etc/cdi/nvidia.yaml ]; then
  echo "setup-builder: generating /etc/cdi/nvidia.yaml"
  nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml
fi
nvidia-ctk cdi list | grep -qxF "$DEVICE" || {
  echo "setup-builder: CDI device $DEVICE not found (nvidia-ctk cdi list)" >&2
  exit 3
}
if docker buildx inspect "$NAME" >/dev/null 2>&1; then
  echo "setup-builder: $NAME exists; remove it with: docker buildx rm $NAME"
  exit 0
fi
docker buildx create --name "$NAME" --driver docker-container \
  --driver-opt "image=$IMAGE" \
  --buildkitd-config "$HERE/buildkitd.toml" \
  --bootstrap
# The worker must list the device, or RUN --device fails at build time.
docker buildx inspect "$NAME" | grep -F "${DEVICE%%=*}" >/dev/null || {
  echo "setup-builder: $NAME does not list CDI devices of kind ${DEVICE%%=*}; check buildkitd.toml" >&2
  exit 3
}
echo "setup-builder: $NAME ready; kernelbake build --gpu <a $FAMILY GPU> uses it"
