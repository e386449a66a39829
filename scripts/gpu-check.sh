#!/usr/bin/env bash
# The GPU proof, on a machine with an NVIDIA GPU: what the node will do there (doctor), the tests
# marked gpu, the game renderer (numpy vs OpenGL on the GPU), the encoders, and one game stream at
# 1080p60 per renderer through the node's real session path.  Prints the figures and writes them
# under $GPU_CHECK_OUT (default artifacts/gpu-check).  Exit status: that of the gpu tests.
#
# Python: $PYTHON, else .venv/bin/python, else python3 (a GPU machine without the venv can carry
# wheels and set PYTHONPATH).  Nothing here runs in CI: CI has no GPU (the gpu tests skip there).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT=${GPU_CHECK_OUT:-artifacts/gpu-check}
QUICK=${GPU_CHECK_QUICK:-1}   # 1: short benchmark windows (fits a 10-minute device slot)
mkdir -p "$OUT"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID

step() { printf '\n===== %s (%s) =====\n' "$1" "$(date -u +%H:%M:%S)"; }

step "machine"
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1 || echo "no nvidia-smi"
  echo "cores: $(nproc)"; uptime; "$PY" --version; } | tee "$OUT/machine.txt"

step "render-node doctor"
"$PY" -m streamer doctor --json >"$OUT/doctor.json" 2>"$OUT/doctor.log"
echo "doctor --json exit $?"
"$PY" -m streamer doctor --require-gpu --require-gl 2>>"$OUT/doctor.log" | tee "$OUT/doctor.txt"
echo "doctor --require-gpu --require-gl exit ${PIPESTATUS[0]}"

step "gpu tests"
"$PY" -m pytest -q -p no:cacheprovider --noconftest -m gpu -rs tests/gpu 2>&1 | tee "$OUT/gpu-tests.txt"
tests_rc=${PIPESTATUS[0]}

step "game renderer: numpy vs OpenGL on GPU 0"
frames=600; [ "$QUICK" = 1 ] && frames=300
"$PY" bench/bench_game.py --frames "$frames" --device 0 --list-devices 4 --json "$OUT/bench_game.json" 2>&1 | tee "$OUT/bench_game.txt"

step "encoders"
"$PY" bench/bench_encoder.py --quick 2>&1 | tee "$OUT/bench_encoder.txt"

step "one game stream at 1080p60 per renderer (node CPU per stream)"
for renderer in cpu gl; do
  "$PY" bench/bench_stream.py --quick --kinds game --profiles 1080p60 --max-sessions 1 \
    --game-renderer "$renderer" --gpu 0 2>&1 | tee "$OUT/bench_stream_$renderer.txt"
done

step "done"
echo "gpu tests exit $tests_rc; figures under $OUT"
exit "$tests_rc"
