#!/usr/bin/env bash
# Regenerate criu.lock from Debian's index with a second apt configuration in a temporary
# directory (the system's sources stay as they are): package, version, sha256, size and pool
# path of criu and every library it loads. CRIU itself (and what its 4.2 needs newer) comes
# from forky: trixie's 4.1.1 cannot dump a TCP socket on kernels >= 6.16, which refuse
# SO_PASSCRED/SO_PASSSEC on it ("Can't get 1:16 opt: Operation not supported"); 4.2.1 can.
# The rest is trixie's, as criu.md measured.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
FORKY="criu libcompel1 libnet9 libnl-3-200"
TRIXIE="libc6 libbsd0 libbz2-1.0 libedit2 libffi8 libgmp10 libgnutls30t64 libhogweed6t64
  libidn2-0 libjansson4 libmd0 libmnl0 libnettle8t64 libnftables1 libnftnl11 libp11-kit0
  libprotobuf-c1 libtasn1-6 libtinfo6 libunistring5 libuuid1 libxtables12 libz3-4 libzstd1 zlib1g"
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
mkdir -p "$t"/etc/apt/{apt.conf.d,preferences.d,sources.list.d} "$t"/var/lib/apt/lists/partial "$t"/var/cache/apt/archives/partial
printf 'deb http://deb.debian.org/debian %s main\n' trixie forky > "$t/etc/apt/sources.list"
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
# forky's Release may carry a Valid-Until this machine's clock has passed.
apt-get -q -o Acquire::Check-Valid-Until=false update >/dev/null
{
  sed -n '1,3p' "$HERE/criu.lock"
  for suite in forky trixie; do
    list=$FORKY; [ "$suite" = trixie ] && list=$TRIXIE
    for p in $list; do
      apt-cache -o APT::Default-Release="$suite" show --no-all-versions "$p" | awk -v p="$p" \
        '/^Version:/{v=$2} /^Filename:/{f=$2} /^SHA256:/{s=$2} /^Size:/{z=$2} END{print p, v, s, z, f}'
    done
  done
} > "$HERE/criu.lock.new"
mv "$HERE/criu.lock.new" "$HERE/criu.lock"
echo "criu.lock: $(grep -vc '^#' "$HERE/criu.lock") packages"
