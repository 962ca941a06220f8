#!/usr/bin/env bash
# Two GPU families on one CPU machine, for the fleet test and bench: two more Docker daemons
# (own data-root, exec-root, socket and bridge each), each with its own CDI device
# kernelbake.dev/test=gpu that makes a compile stage there report another device name, and a
# docker context kernelbake-<family> for each, which `kernelbake build` uses as that family's
# builder. Nothing is pulled: the images named are copied in from the default daemon.
# Each daemon, and every container and build step it starts, is confined to its own CPU core
# (a cpuset cgroup, --cgroup-parent), so that two builds at once on one host measure the
# orchestration rather than two compiles sharing cores, as builders on separate hosts would
# not. FLEET_CPUS="0 1" picks the cores (one per family); FLEET_CPUS=none confines nothing.
# DIR/<family>/cpuset records what each got.
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
CG=/sys/fs/cgroup

# The cpuset each family's daemon runs in: "0", "1" by default, or none on a 1-core host.
cpus_for() {
  local i=$1 cpus
  read -r -a cpus <<< "${FLEET_CPUS:-0 1}"
  if [ "${cpus[0]}" = none ] || [ "$(nproc)" -lt "${#families[@]}" ]; then
    return
  fi
  echo "${cpus[$i]}"
}

# The cgroup directory of the cpuset controller (v1: its own hierarchy; v2: the unified one).
cpuset_root() {
  if [ -f "$CG/cgroup.controllers" ]; then
    grep -qw cpuset "$CG/cgroup.subtree_control" || echo +cpuset > "$CG/cgroup.subtree_control"
    echo "$CG"
  else
    echo "$CG/cpuset"
  fi
}

# kbtest-<f>: cpus only there; the daemon itself in kbtest-<f>/daemon (cgroup v2 allows no
# processes beside child groups), its containers in kbtest-<f>/<id> (--cgroup-parent).
confine() {
  # Every step checked: it runs as an `if` condition, where set -e does not apply.
  local f=$1 cpus=$2 root mems g
  root=$(cpuset_root) || return 1
  mkdir -p "$root/kbtest-$f/daemon" || return 1
  if [ -f "$CG/cgroup.controllers" ]; then
    mems=$(cat "$root/cpuset.mems.effective") || return 1
    echo +cpuset > "$root/kbtest-$f/cgroup.subtree_control" || return 1
  else
    mems=$(cat "$root/cpuset.mems") || return 1
  fi
  # v1 gives a new cpuset no cpus or mems of its own: set both, at each level.
  for g in "$root/kbtest-$f" "$root/kbtest-$f/daemon"; do
    echo "$mems" > "$g/cpuset.mems" || return 1
    echo "$cpus" > "$g/cpuset.cpus" || return 1
  done
  echo "$root/kbtest-$f/daemon"
}

unconfine() {
  # Leaves first: runc leaves kbtest-<f> in every v1 hierarchy it placed a container in.
  local d
  for d in $(find "$CG" -mindepth 1 -maxdepth 2 -type d -name "kbtest-$1" 2>/dev/null); do
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
}

bridge() { echo "kbtest$1"; }
subnet() { case $1 in a) echo 172.30.201.1/24 ;; b) echo 172.30.202.1/24 ;; esac; }

down() {
  for f in "${families[@]}"; do
    local pidfile="$dir/$f/docker.pid" pid
    # dockerd removes its pid file as it exits: read it once.
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -n "$pid" ] && kill "$pid" 2>/dev/null; then
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
    ip link del "$(bridge "$f")" 2>/dev/null || true
    unconfine "$f"
  done
  rm -rf "$dir"
}

up() {
  [ "$(id -u)" = 0 ] || { echo "test-fleet: needs root (dockerd, bridges)" >&2; exit 3; }
  mkdir -p "$dir/config"
  local i=0
  for f in "${families[@]}"; do
    local d="$dir/$f" upper cpus group=""
    mkdir -p "$d"
    upper=$(echo "$f" | tr a-z A-Z)
    cpus=$(cpus_for "$i")
    i=$((i + 1))
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
    local confined=()
    if [ -n "$cpus" ]; then
      # Best effort: the fleet test needs two daemons, not their cores; the bench records
      # "none" when a host (a container without cgroup rights, say) cannot confine them.
      if group=$(confine "$f" "$cpus" 2> "$d/cpuset.err"); then
        confined=(--cgroup-parent "/kbtest-$f")
      else
        echo "test-fleet: daemon $f runs on every core: no cpuset $cpus here ($(tail -1 "$d/cpuset.err"))" >&2
        cpus="" group=""
        unconfine "$f"
      fi
    fi
    echo "${cpus:-none}" > "$d/cpuset"
    # No iptables rules: the builds need no network (wheels are copied in, nothing is pulled).
    # The subshell joins the cgroup first, so dockerd and its containerd start inside it.
    (
      [ -z "$group" ] || echo "$BASHPID" > "$group/cgroup.procs"
      exec dockerd --data-root "$d/data" --exec-root "$d/exec" --pidfile "$d/docker.pid" \
        -H "unix://$d/docker.sock" --bridge "$(bridge "$f")" --iptables=false --ip6tables=false \
        --cdi-spec-dir "$d/cdi" "${confined[@]}" > "$d/dockerd.log" 2>&1
    ) &
  done
  for f in "${families[@]}"; do
    for _ in $(seq 150); do docker -H "unix://$dir/$f/docker.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
    docker -H "unix://$dir/$f/docker.sock" version >/dev/null || { cat "$dir/$f/dockerd.log" >&2; exit 3; }
    DOCKER_CONFIG="$dir/config" docker context create "kernelbake-test-$f" \
      --docker "host=unix://$dir/$f/docker.sock" >/dev/null
  done
  local image
  for image in "$@"; do load_everywhere "$image"; done
  echo "export DOCKER_CONFIG=$dir/config"
}

# One `docker save` of IMAGE, read by every daemon's `docker load` at once through a fifo each
# (a save of the torch base image is ~17 s of I/O on a loaded host: once, not once per daemon).
load_everywhere() {
  local image=$1 f fifos=() pids=() p
  for f in "${families[@]}"; do
    rm -f "$dir/$f/load.fifo"
    mkfifo "$dir/$f/load.fifo"
    docker -H "unix://$dir/$f/docker.sock" load -q < "$dir/$f/load.fifo" >/dev/null &
    pids+=($!)
    fifos+=("$dir/$f/load.fifo")
  done
  docker save "$image" | tee "${fifos[@]}" >/dev/null
  for p in "${pids[@]}"; do wait "$p"; done
  rm -f "${fifos[@]}"
}

case $cmd in
  up) up "$@" ;;
  down) down ;;
  *) echo "usage: test-fleet.sh up|down DIR [IMAGE...]" >&2; exit 2 ;;
esac
