#!/usr/bin/env bash
# Regenerate criu.lock from Debian trixie's index with a second apt configuration in a
# temporary directory (the system's sources stay as they are): package, version, sha256,
# size and pool path of criu and every library it loads.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PACKAGES="criu libcompel1 libc6 libbsd0 libbz2-1.0 libedit2 libffi8 libgmp10 libgnutls30t64 libhogweed6t64
  libidn2-0 libjansson4 libmd0 libmnl0 libnet1 libnettle8t64 libnftables1 libnftnl11 libnl-3-200 libp11-kit0
  libprotobuf-c1 libtasn1-6 libtinfo6 libunistring5 libuuid1 libxtables12 libz3-4 libzstd1 zlib1g"
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
mkdir -p "$t"/etc/apt/{apt.conf.d,preferences.d,sources.list.d} "$t"/var/lib/apt/lists/partial "$t"/var/cache/apt/archives/partial
echo "deb http://deb.debian.org/debian trixie main" > "$t/etc/apt/sources.list"
touch "$t/status"
cat > "$t/apt.conf" <<CONF
Dir "$t/";
Dir::State "$t/var/lib/apt/";
Dir::Cache "$t/var/cache/apt/";
Dir::Etc "$t/etc/apt/";
Dir::Etc::TrustedParts "/usr/share/keyrings/";
Dir::State::status "$t/status";
APT::Architecture "amd64";
CONF
export APT_CONFIG="$t/apt.conf"
apt-get -q update >/dev/null
{
  sed -n '1,3p' "$HERE/criu.lock"
  for p in $PACKAGES; do
    apt-cache show --no-all-versions "$p" | awk -v p="$p" \
      '/^Version:/{v=$2} /^Filename:/{f=$2} /^SHA256:/{s=$2} /^Size:/{z=$2} END{print p, v, s, z, f}'
  done
} > "$HERE/criu.lock.new"
mv "$HERE/criu.lock.new" "$HERE/criu.lock"
echo "criu.lock: $(grep -vc '^#' "$HERE/criu.lock") packages"
