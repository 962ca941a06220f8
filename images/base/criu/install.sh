#!/usr/bin/env bash
# Install CRIU 4.2.1 (Debian forky, on trixie's libraries) into a private prefix, from the .debs
# that criu.lock pins by version and sha256. Bookworm's criu 3.17 fails `criu check` on kernels
# >= 6.13 ("Unexpected rt vDSO area bounds"); trixie's 4.1.1 passes it but cannot dump a TCP
# socket on kernels >= 6.16 (lock.sh says why). It needs glibc >= 2.38, so it runs through
# trixie's own loader from the prefix, and the system's libc is left alone.
#   install.sh PREFIX            download from $DEBIAN_MIRROR (default http://deb.debian.org/debian)
#   DEBS=DIR install.sh PREFIX   take the .debs from DIR (no network: a build context, the device)
# Writes PREFIX/bin/criu, a wrapper that runs criu through that loader, and PREFIX/criu.lock.
# Exit 3: a .deb missing or with another sha256; nothing is unpacked then.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PREFIX=${1:?usage: install.sh PREFIX}
LOCK=${LOCK:-$HERE/criu.lock}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBS=${DEBS:-}
# KEEP=DIR: also leave the checked .debs there (a build context, or the device's bundle).
KEEP=${KEEP:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fetch() { # pool-path dest
  if [ -n "$DEBS" ]; then
    cp "$DEBS/$(basename "$1")" "$2" 2>/dev/null || { echo "criu: $DEBS/$(basename "$1") is missing" >&2; exit 3; }
  elif command -v curl >/dev/null; then
    curl -fsSL --retry 3 -o "$2" "$MIRROR/$1" || { echo "criu: cannot download $MIRROR/$1 (a point release may have moved it: set DEBIAN_MIRROR to a snapshot.debian.org archive)" >&2; exit 3; }
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$MIRROR/$1" "$2" \
      || { echo "criu: cannot download $MIRROR/$1" >&2; exit 3; }
  fi
}

# Every .deb is fetched and checked before the first is unpacked: a bad one leaves no prefix.
n=0
while read -r pkg version sha size path; do
  case "$pkg" in ''|'#'*) continue ;; esac
  deb="$work/$(basename "$path")"
  fetch "$path" "$deb"
  got=$(sha256sum "$deb" | cut -d' ' -f1)
  if [ "$got" != "$sha" ]; then
    echo "criu: $pkg $version: sha256 $got, criu.lock pins $sha; not installing" >&2
    exit 3
  fi
  n=$((n + 1))
done < "$LOCK"
if [ -n "$KEEP" ]; then mkdir -p "$KEEP" && cp "$work"/*.deb "$KEEP/"; fi
mkdir -p "$PREFIX/bin"
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$PREFIX"; done
cp "$LOCK" "$PREFIX/criu.lock"
cat > "$PREFIX/bin/criu" <<'WRAP'
#!/bin/sh
# CRIU from this prefix through trixie's loader (criu.lock beside it names every package);
# relative to this script, so the prefix can be copied or mounted anywhere.
p=$(cd "$(dirname "$0")/.." && pwd)
exec "$p/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" \
  --library-path "$p/usr/lib/x86_64-linux-gnu:$p/lib/x86_64-linux-gnu" "$p/usr/sbin/criu" "$@"
WRAP
chmod 0755 "$PREFIX/bin/criu"
echo "criu: $n packages checked and unpacked into $PREFIX; $("$PREFIX/bin/criu" --version | head -1)"
