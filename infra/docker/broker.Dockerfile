# The broker image.  Build from the repository root:
#   docker build -f infra/docker/broker.Dockerfile -t render-broker:0.1.0 .
# Debian packages: exactly scripts/packages/broker.txt (the list scripts/setup.sh installs too);
# Python: the project with its `kubernetes` extra (the autoscaler's kubernetes provider).
# tests/infra/test_images.py keeps both in step; no test builds the image.
FROM python:3.11-slim-bookworm

COPY scripts/packages/ /tmp/packages/
RUN /tmp/packages/install.sh broker && rm -rf /var/lib/apt/lists/* /tmp/packages

# an editable install keeps web/ beside broker/ (the broker serves it from there)
WORKDIR /opt/render-broker
COPY pyproject.toml README.md ./
COPY rbcommon/ rbcommon/
COPY encoder/ encoder/
COPY broker/ broker/
COPY streamer/ streamer/
COPY rbclient/ rbclient/
COPY web/ web/
COPY infra/docker/healthcheck.py /usr/local/lib/render-broker/healthcheck.py
RUN pip install --no-cache-dir -e '.[kubernetes]'

RUN useradd --create-home --uid 10001 --user-group render && install -d -o render -g render /var/lib/render-broker
USER 10001
ENV BROKER_HOST=0.0.0.0 BROKER_PORT=8080 BROKER_DATA_DIR=/var/lib/render-broker PYTHONUNBUFFERED=1
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "/usr/local/lib/render-broker/healthcheck.py", "broker"]
ENTRYPOINT ["tini", "--"]
CMD ["render-broker", "serve"]
