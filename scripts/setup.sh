#!/usr/bin/env bash
# Install everything render-broker needs on a fresh Debian machine: system packages
# (Xvfb, a window manager, a terminal, XTest tools, Chromium, netns tooling) and a
# virtualenv with the project and its test extras.  Idempotent: re-running is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: the lists in scripts/packages (broker.txt and node.txt are also exactly what the
# images in infra/docker install; dev.txt is for tests and labs), installed where missing.
scripts/packages/install.sh broker node dev

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test,play,dev]'
echo "setup: done ($(.venv/bin/python --version))"
