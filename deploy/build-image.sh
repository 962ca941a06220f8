#!/usr/bin/env bash
# Build the admission webhook's image (deploy/Dockerfile) from wheels downloaded on the host:
#   1. the kernelbake wheel, built from this tree;
#   2. every dependency of kernelbake[host] as CPython 3.11 manylinux x86_64 wheels;
#   3. docker buildx build on BASE, a local image with Python 3.11 and pip (default: the Debian 12
#      rootfs that images/base/cpu/build.sh imports; no image is pulled from a public registry).
# Usage: deploy/build-image.sh [IMAGE]   (VENV, WORK, BASE override the defaults below)
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${1:-registry.example.com/kernelbake/admission:$(sed -n 's/^__version__ = "\(.*\)"/\1/p' src/kernelbake/__init__.py)}
VENV=${VENV:-.venv}
WORK=${WORK:-build/admission/image}
BASE=${BASE:-kernelbake/debian-rootfs:bookworm}

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  echo "admission image: base image $BASE is missing (images/base/cpu/build.sh imports it; or set BASE)" >&2
  exit 3
fi
rm -rf "$WORK/wheels"
mkdir -p "$WORK/wheels"
echo "admission image: building the kernelbake wheel"
"$VENV/bin/pip" wheel -q --no-deps -w "$WORK/wheels" .
wheel=$(ls "$WORK"/wheels/kernelbake-*.whl)
echo "admission image: downloading kernelbake[host]'s dependencies into $WORK/wheels"
"$VENV/bin/pip" download -q --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
  -d "$WORK/wheels" "$wheel[host]"
echo "admission image: building $IMAGE"
# No network in the build: everything comes from wheels/.
docker buildx build --progress=plain --load --network=none -t "$IMAGE" --build-arg "BASE=$BASE" \
  -f deploy/Dockerfile "$WORK"
