#!/usr/bin/env bash
# Install everything render-broker needs on a fresh Debian machine: system packages
# (Xvfb, a window manager, a terminal, XTest tools, Chromium, netns tooling) and a
# virtualenv with the project and its test extras.  Idempotent: re-running is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."

# gcc, libc6-dev, python3-dev and libnetfilter-queue-dev build the NetfilterQueue sdist
# (test extra) that the network-emulation harness in tests/netem uses for delay/jitter.
DEB_PACKAGES=(xvfb openbox xterm xdotool x11-utils xclip chromium iproute2 iptables nftables
  gcc libc6-dev python3-dev libnetfilter-queue-dev
  libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libgles2  # EGL + llvmpipe: the game's GL renderer without a GPU
  prometheus  # promtool: tests/infra/test_monitoring.py checks and unit-tests the alert rules
  redis-server  # the system redis-server: tests/broker/test_sentinel.py runs a master, a replica and a sentinel
  nginx-light  # reverse proxy: tests/infra/test_nginx.py runs infra/nginx/render-broker.conf (its daemon is not used)
  coturn  # TURN server: tests/netem/test_turn.py relays sessions through it (its daemon is not enabled)
  pulseaudio pulseaudio-utils  # a desktop session's sound: its own PulseAudio, parec capture (streamer/desktop/audio.py)
  # GStreamer 1.22 webrtcbin + the system Python's gi bindings: tests/streamer/media/test_webrtcbin_e2e.py
  # streams to a native (non-browser) WebRTC client, as a third-party client author would build one
  python3-gi gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0 gir1.2-gst-plugins-bad-1.0
  gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-nice gstreamer1.0-libav)
missing=()
for p in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test,dev]'
echo "setup: done ($(.venv/bin/python --version))"
