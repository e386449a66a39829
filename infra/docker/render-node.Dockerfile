# The render-node image (the streamer agent).  Build from the repository root:
#   docker build -f infra/docker/render-node.Dockerfile -t render-node:0.1.0 .
# Debian packages: exactly scripts/packages/node.txt (the list scripts/setup.sh installs too): Xvfb,
# openbox, PulseAudio, the libglvnd GL/EGL loaders.  FFmpeg, libvpx, Opus and SRTP come inside the
# PyAV/aiortc wheels.  tests/infra/test_images.py keeps it in step; no test builds the image.
#
# GPU: run with the NVIDIA container toolkit (Kubernetes: the device plugin, `nvidia.com/gpu`).  The
# variables below ask it to mount the driver's userspace: libcuda/libnvidia-encode (compute, video:
# NVENC), libEGL_nvidia + the glvnd vendor files (graphics: the game's EGL renderer), nvidia-smi/NVML
# (utility: telemetry).  For GLX apps in a desktop session on the GPU also set
# __GLX_VENDOR_LIBRARY_NAME=nvidia (not set here: without a GPU it would break Mesa's GLX).
FROM python:3.11-slim-bookworm

COPY scripts/packages/ /tmp/packages/
RUN /tmp/packages/install.sh node && rm -rf /var/lib/apt/lists/* /tmp/packages

WORKDIR /opt/render-broker
COPY pyproject.toml README.md ./
COPY rbcommon/ rbcommon/
COPY encoder/ encoder/
COPY broker/ broker/
COPY streamer/ streamer/
COPY rbclient/ rbclient/
COPY web/ web/
COPY infra/docker/healthcheck.py /usr/local/lib/render-broker/healthcheck.py
RUN pip install --no-cache-dir -e .

# Xvfb needs the X socket directory sticky and world-writable when it does not run as root
RUN useradd --create-home --uid 10001 --user-group render && install -d -m 1777 /tmp/.X11-unix
USER 10001
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=all \
    NODE_HEALTH_PORT=8090 PYTHONUNBUFFERED=1
EXPOSE 8090
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=6 \
  CMD ["python", "/usr/local/lib/render-broker/healthcheck.py", "node"]
# tini forwards SIGTERM to render-node, which drains for NODE_SHUTDOWN_GRACE_S before it stops
# (give the container longer: docker stop -t, compose stop_grace_period, the pod's grace period)
ENTRYPOINT ["tini", "--"]
CMD ["render-node"]
