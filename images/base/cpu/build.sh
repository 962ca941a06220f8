#!/usr/bin/env bash
# Build the torch engine's CPU base image (the catalogue's base_image for torch $1) from
# Debian packages and wheels only: no image can be pulled from a public registry here.
#   1. the Debian 12 rootfs image (../rootfs.sh);
#   2. pip download transformers (and torch's dependencies) on the host, next to the torch
#      CPU wheel ($TORCH_WHEEL), because containers cannot reach PyPI with TLS;
#   3. install them into the rootfs image (Dockerfile beside this script).
set -euo pipefail
cd "$(dirname "$0")/../../.."

ENGINE_VERSION=${1:-2.13.0}
VENV=${VENV:-.venv}
WORK=${WORK:-.cache/cpu-base}
ROOTFS_IMAGE=${ROOTFS_IMAGE:-kernelbake/debian-rootfs:bookworm}

# Versions and the image name come from the catalogue, the one place that states them.
read -r TORCH_VERSION TRANSFORMERS_VERSION IMAGE < <("$VENV/bin/python" - "$ENGINE_VERSION" <<'PY'
import sys
from kernelbake.catalogue import Build, load_catalogue
from kernelbake.contract.key import Engine
r = load_catalogue().engine(Engine.TORCH, sys.argv[1], Build.CPU, where="images/base/cpu/build.sh")
print(r.software.torch, r.transformers, r.base_image)
PY
)
IMAGE=${CPU_BASE_IMAGE:-$IMAGE}
TORCH_WHEEL=${TORCH_WHEEL:-/opt/wheels/torch-${TORCH_VERSION}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}

if docker image inspect "$IMAGE" >/dev/null 2>&1 && [ -z "${FORCE:-}" ]; then
  echo "cpu-base: $IMAGE exists (FORCE=1 rebuilds it)"
  exit 0
fi
mkdir -p "$WORK"
if [ ! -f "$TORCH_WHEEL" ]; then
  echo "cpu-base: the torch $TORCH_VERSION CPU wheel is missing: $TORCH_WHEEL (set TORCH_WHEEL)" >&2
  exit 3
fi

ROOTFS_IMAGE=$ROOTFS_IMAGE LOG="$WORK.debootstrap.log" images/base/rootfs.sh

mkdir -p "$WORK/wheels"
echo "cpu-base: downloading wheels for Python 3.11 into $WORK/wheels"
"$VENV/bin/pip" download -q --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$WORK/wheels" "$TORCH_WHEEL" "transformers==$TRANSFORMERS_VERSION"

echo "cpu-base: building $IMAGE"
docker buildx build --progress=plain --load -t "$IMAGE" \
  --build-arg "ROOTFS=$ROOTFS_IMAGE" \
  --build-arg "TORCH_VERSION=$TORCH_VERSION" \
  --build-arg "TRANSFORMERS_VERSION=$TRANSFORMERS_VERSION" \
  -f images/base/cpu/Dockerfile "$WORK"
