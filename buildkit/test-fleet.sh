#!/usr/bin/env bash
# Two GPU families on one CPU machine, for the fleet test and bench: two more Docker daemons
# (own data-root, exec-root, socket and bridge each), each with its own CDI device
# kernelbake.dev/test=gpu that makes a compile stage there report another device name, and a
# docker context kernelbake-<family> for each, which `kernelbake build` uses as that family's
# builder. Nothing is pulled: the images named are copied in from the default daemon.
#
#   buildkit/test-fleet.sh up DIR [IMAGE…]   # prints: export DOCKER_CONFIG=DIR/config
#   buildkit/test-fleet.sh down DIR
#
# The families are the catalogue's stand-ins test-a and test-b ("kernelbake test device A"/"B").
set -euo pipefail
cmd=${1:?usage: test-fleet.sh up|down DIR [IMAGE...]}
dir=${2:?usage: test-fleet.sh up|down DIR [IMAGE...]}
shift 2
families=(a b)

bridge() { echo "kbtest$1"; }
subnet() { case $1 in a) echo 172.30.201.1/24 ;; b) echo 172.30.202.1/24 ;; esac; }

down() {
  for f in "${families[@]}"; do
    local pidfile="$dir/$f/docker.pid"
    if [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null; then
      for _ in $(seq 100); do kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.2; done
    fi
    ip link del "$(bridge "$f")" 2>/dev/null || true
  done
  rm -rf "$dir"
}

up() {
  [ "$(id -u)" = 0 ] || { echo "test-fleet: needs root (dockerd, bridges)" >&2; exit 3; }
  mkdir -p "$dir/config"
  for f in "${families[@]}"; do
    local d="$dir/$f" upper
    upper=$(echo "$f" | tr a-z A-Z)
    mkdir -p "$d/cdi"
    cat > "$d/cdi/kernelbake-test.yaml" <<YAML
cdiVersion: "0.6.0"
kind: kernelbake.dev/test
devices:
  - name: gpu
    containerEdits:
      env:
        - KERNELBAKE_UNSAFE_TEST_DEVICE=kernelbake test device $upper
        - KERNELBAKE_BUILDER=test-fleet:$f
YAML
    if ! ip link show "$(bridge "$f")" >/dev/null 2>&1; then
      ip link add "$(bridge "$f")" type bridge
      ip addr add "$(subnet "$f")" dev "$(bridge "$f")"
      ip link set "$(bridge "$f")" up
    fi
    # No iptables rules: the builds need no network (wheels are copied in, nothing is pulled).
    dockerd --data-root "$d/data" --exec-root "$d/exec" --pidfile "$d/docker.pid" \
      -H "unix://$d/docker.sock" --bridge "$(bridge "$f")" --iptables=false --ip6tables=false \
      --cdi-spec-dir "$d/cdi" > "$d/dockerd.log" 2>&1 &
  done
  for f in "${families[@]}"; do
    for _ in $(seq 150); do docker -H "unix://$dir/$f/docker.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
    docker -H "unix://$dir/$f/docker.sock" version >/dev/null || { cat "$dir/$f/dockerd.log" >&2; exit 3; }
    DOCKER_CONFIG="$dir/config" docker context create "kernelbake-test-$f" \
      --docker "host=unix://$dir/$f/docker.sock" >/dev/null
  done
  local pids=()
  for image in "$@"; do
    for f in "${families[@]}"; do
      (docker save "$image" | docker -H "unix://$dir/$f/docker.sock" load -q >/dev/null) &
      pids+=($!)
    done
  done
  for p in "${pids[@]}"; do wait "$p"; done
  echo "export DOCKER_CONFIG=$dir/config"
}

case $cmd in
  up) up "$@" ;;
  down) down ;;
  *) echo "usage: test-fleet.sh up|down DIR [IMAGE...]" >&2; exit 2 ;;
esac
