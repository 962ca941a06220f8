#!/usr/bin/env bash
# Start Debian's docker-registry on 127.0.0.1:PORT (storage under DIR) unless a registry
# already answers there. Never listens on other interfaces, no auth: local use only.
set -euo pipefail
PORT=${1:-5000}
DIR=${2:-build/registry}
ADDR=127.0.0.1:$PORT
if curl -fs -o /dev/null "http://$ADDR/v2/"; then
  echo "registry: $ADDR is up"
  exit 0
fi
mkdir -p "$DIR/data"
DIR=$(cd "$DIR" && pwd)
cat > "$DIR/config.yml" <<CONF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $DIR/data
  delete:
    enabled: true
http:
  addr: $ADDR
CONF
setsid docker-registry serve "$DIR/config.yml" > "$DIR/registry.log" 2>&1 < /dev/null &
echo $! > "$DIR/registry.pid"
for _ in $(seq 1 50); do
  if curl -fs -o /dev/null "http://$ADDR/v2/"; then
    echo "registry: started on $ADDR (pid $(cat "$DIR/registry.pid"), data $DIR/data)"
    exit 0
  fi
  sleep 0.2
done
echo "registry: did not start on $ADDR; see $DIR/registry.log" >&2
exit 3
