# The buildx version the GPU builder path needs and the one `make deps` installs, with the
# one parser of `docker buildx version`. Sourced by scripts/deps.sh and
# buildkit/setup-builder.sh, so that what one installs is what the other accepts.

# RUN --device (a CDI device inside a BuildKit build) needs buildx 0.22 or newer.
BUILDX_MIN=0.22
# Debian sid's docker-buildx; it depends only on libc6 >= 2.34 (Debian 12 has 2.36). Trixie
# and trixie-backports carry 0.13.1 only. Sid moves: the version is pinned, and a sid that no
# longer has it stops `make deps` with a line saying so (BUILDX_DEBIAN= picks another).
BUILDX_DEBIAN=${BUILDX_DEBIAN:-0.29.1+ds1-4}

# "github.com/docker/buildx 0.13.1+ds1 0.13.1+ds1-3" (Debian), "github.com/docker/buildx
# v0.29.1 abc123" (Docker's plugin) -> 0.13.1 / 0.29.1; nothing when buildx is absent or
# prints no version (an unreadable one must not sort above the minimum).
buildx_version() {
  local out
  out=$(docker buildx version 2>/dev/null) || return 0
  printf '%s\n' "$out" | awk 'NR == 1 {print $2}' | sed 's/^v//; s/[+-].*//' | grep -E '^[0-9]+(\.[0-9]+)+$' || true
}

# version_at_least FOUND NEEDED
version_at_least() {
  [ "$(printf '%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]
}
