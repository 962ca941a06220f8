#!/usr/bin/env bash
# Installs what the signing tests need on a Debian 12 host (root). Idempotent: each step is
# skipped when its result is already there.
#
#   cosign 2.5.0  (Debian trixie)  -> /usr/bin/cosign          reads/writes the legacy .sig/.att tags
#   cosign 3.1.1  (Debian sid)     -> $COSIGN3_DIR/usr/bin/cosign (unpacked, not dpkg-installed, so
#                                     it lives beside 2.5.0)   reads/writes sigstore bundles as referrers
#   @sigstore/mock + deps (npm ci) -> tests/signing/mockserver/node_modules
#
# Debian's docker-registry and node (^20.17 || >= 22.9) with npm are expected to be installed
# already (`make deps` installs both); this script checks for them and says so if they are missing.
#
# Call it from the Makefile (`make signing-deps`, see mk/signing.mk) or .ci/run, before the tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COSIGN2_VERSION="${COSIGN2_VERSION:-2.}"  # trixie ships 2.5.0; accept its point releases
# Any 3.x: sid moves, and a pinned patch release disappears from it (3.1.1 was verified).
COSIGN3_VERSION="${COSIGN3_VERSION:-3.}"
COSIGN3_DIR="${COSIGN3_DIR:-/opt/kernelbake/cosign3}"
APT_STATE="${APT_STATE:-/var/cache/kernelbake-apt}"

say() { echo "setup-signing-deps: $*"; }

# apt-get against one extra suite, in a private state dir, so the host's sources stay untouched.
suite_download() {  # suite package version-prefix outdir
    local suite="$1" pkg="$2" version="$3" out="$4"
    local state="$APT_STATE/$suite"
    mkdir -p "$state/lists/partial" "$out"
    chmod 755 "$out"  # apt's _apt user downloads into it
    echo "deb http://deb.debian.org/debian $suite main" >"$state/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o "Dir::Etc::SourceParts=-"
        -o "Dir::State::Lists=$state/lists" -o "Debug::NoLocking=1")
    apt-get "${opts[@]}" update -qq
    local full
    full="$(apt-cache "${opts[@]}" madison "$pkg" | awk -v v="$version" '$3 ~ "^"v {print $3; exit}')"
    if [[ -z "$full" ]]; then
        say "error: $pkg $version is not in Debian $suite any more; available:" >&2
        apt-cache "${opts[@]}" madison "$pkg" >&2 || true
        return 1
    fi
    (cd "$out" && apt-get "${opts[@]}" download "$pkg=$full")
}

command -v /usr/bin/docker-registry >/dev/null || { say "error: docker-registry missing (apt-get install docker-registry)" >&2; exit 1; }
"$ROOT/scripts/node.sh" check || exit 1

if [[ "$(dpkg-query -W -f '${Version}' cosign 2>/dev/null)" == "$COSIGN2_VERSION"* ]]; then
    say "cosign $(dpkg-query -W -f '${Version}' cosign) already installed"
else
    tmp="$(mktemp -d)"
    suite_download trixie cosign "$COSIGN2_VERSION" "$tmp"
    dpkg -i "$tmp"/cosign_*.deb
    rm -rf "$tmp"
fi

if [[ "$(cat "$COSIGN3_DIR/.version" 2>/dev/null)" == "$COSIGN3_VERSION"* ]]; then
    say "cosign $(cat "$COSIGN3_DIR/.version") already unpacked in $COSIGN3_DIR"
else
    tmp="$(mktemp -d)"
    suite_download sid cosign "$COSIGN3_VERSION" "$tmp"
    rm -rf "$COSIGN3_DIR" && mkdir -p "$COSIGN3_DIR"
    dpkg -x "$tmp"/cosign_*.deb "$COSIGN3_DIR"
    dpkg-deb -f "$tmp"/cosign_*.deb Version >"$COSIGN3_DIR/.version"
    rm -rf "$tmp"
fi

MOCK="$ROOT/tests/signing/mockserver"
if [[ -f "$MOCK/node_modules/.package-lock.json" ]] && cmp -s "$MOCK/package-lock.json" "$MOCK/.installed-lock" 2>/dev/null; then
    say "@sigstore/mock already installed"
else
    npm ci --prefix "$MOCK" --no-audit --no-fund --loglevel=error
    cp "$MOCK/package-lock.json" "$MOCK/.installed-lock"
fi

say "ok: cosign $(dpkg-query -W -f '${Version}' cosign) at $(command -v cosign), cosign $(cat "$COSIGN3_DIR/.version") at $COSIGN3_DIR/usr/bin/cosign, node $(node --version)"
