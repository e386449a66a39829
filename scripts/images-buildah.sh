#!/usr/bin/env bash
# Build both images (infra/docker/broker.Dockerfile and render-node.Dockerfile, unchanged) with
# buildah, without a Docker engine or a container registry, and smoke-run them:
#   - the broker image serves /readyz as its non-root user (uid 10001), and its HEALTHCHECK passes;
#   - the render-node image registers its host with that broker.
# Not part of the test command or CI (minutes of downloads and builds).  Needs root, Debian's
# package mirror and PyPI.  Usage: sudo scripts/images-buildah.sh   (RB_IMAGES_WORK=DIR to move the work folder)
#
# Stand-in base: the registry that holds python:3.11-slim-bookworm may be unreachable, so this
# script makes a local image under that name with debootstrap (Debian bookworm, minbase) plus
# Debian's python3 3.11 and pip, `python`/`pip` on PATH in /usr/local/bin, pip allowed to install
# system-wide (as in the real image), and this machine's locally added CA certificates
# (/usr/local/share/ca-certificates) so that pip and apt reach their mirrors through a
# TLS-inspecting proxy.  It differs from the real image in that: python is Debian's build in
# /usr/bin, not python.org's in /usr/local.  The stand-in is kept in the work folder's storage and
# reused by later runs (RB_IMAGES_REBASE=1 makes it again).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${RB_IMAGES_WORK:-/var/tmp/rb-images}
MIRROR=${RB_IMAGES_MIRROR:-http://deb.debian.org/debian}
BASE=docker.io/library/python:3.11-slim-bookworm
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
export BUILDAH_ISOLATION=chroot  # no user namespaces or runc needed; the host's network
B=(buildah --root "$WORK/storage" --runroot "$WORK/run")
say() { printf '[images %s] %s\n' "$(date +%T)" "$*"; }

[ "$(id -u)" -eq 0 ] || { echo "images-buildah.sh: run as root (buildah's storage, debootstrap)" >&2; exit 2; }
missing=()
for tool in buildah debootstrap curl; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  say "installing ${missing[*]} (Debian packages)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
mkdir -p "$WORK"
t0=$SECONDS

# ---- the stand-in base image ---------------------------------------------------------------------
if [ "${RB_IMAGES_REBASE:-0}" = 1 ] || ! "${B[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  say "stand-in for $BASE: debootstrap bookworm from $MIRROR"
  rootfs="$WORK/rootfs"
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates bookworm "$rootfs" "$MIRROR" \
    > "$WORK/debootstrap.log"
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/" 2>/dev/null || true
  chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
  ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
  ln -sf /usr/bin/pip3 "$rootfs/usr/local/bin/pip"
  rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED  # python:3.11-slim lets pip install system-wide
  chroot "$rootfs" apt-get clean
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
  ctr=$("${B[@]}" from scratch)
  mnt=$("${B[@]}" mount "$ctr")
  tar -C "$rootfs" -c . | tar -C "$mnt" -x
  "${B[@]}" umount "$ctr" >/dev/null
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 --label org.opencontainers.image.description="local stand-in for $BASE (debootstrap)" "$ctr"
  "${B[@]}" commit -q --rm "$ctr" "$BASE" >/dev/null
  rm -rf "$rootfs"
  say "stand-in base made in $((SECONDS - t0)) s"
fi

# ---- the two images, from their Dockerfiles as they are -------------------------------------------
for pair in broker:render-broker render-node:render-node; do
  file=${pair%%:*} image=${pair#*:}
  t=$SECONDS
  say "building $image:$VERSION from infra/docker/$file.Dockerfile"
  # docker format: OCI image configs have no HEALTHCHECK, and the smoke run below reads it
  "${B[@]}" bud --pull=never --layers --format docker -q -f "infra/docker/$file.Dockerfile" -t "$image:$VERSION" \
    "$ROOT" > "$WORK/build-$file.log" 2>&1 || { tail -40 "$WORK/build-$file.log"; exit 1; }
  say "built $image:$VERSION in $((SECONDS - t)) s"
done
"${B[@]}" images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep -E "render-broker|render-node|python" | sed 's/^/  /'

# ---- smoke runs -----------------------------------------------------------------------------------
ADMIN=images-smoke-admin NODE=images-smoke-node
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
containers=() runs=()
descendants() { local c; for c in $(ps -o pid= --ppid "$1"); do echo "$c"; descendants "$c"; done; }
run_root() {  # the file system root (a bind mount of its own) of what `buildah run` pid $1 started
  local p r
  for p in $(descendants "$1"); do
    r=$(readlink "/proc/$p/root" 2>/dev/null) || continue
    [ "$r" != / ] && { echo "$r"; return; }
  done
}
in_root() { local p; for p in /proc/[0-9]*; do [ "$(readlink "$p/root" 2>/dev/null)" = "$1" ] && echo "${p#/proc/}"; done; }
cleanup() {
  local pid root i
  for ((i = ${#runs[@]} - 1; i >= 0; i--)); do  # the node before the broker it deregisters from
    pid=${runs[i]}
    root=$(run_root "$pid")
    if [ -n "$root" ]; then  # every process under that root is one this script started
      kill -TERM $(in_root "$root") 2>/dev/null || true
      for _ in $(seq 100); do [ -z "$(in_root "$root")" ] && break; sleep 0.1; done
      kill -KILL $(in_root "$root") 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  for c in "${containers[@]}"; do "${B[@]}" rm "$c" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
config() {  # config IMAGE FIELD: a list field of the image's configuration, one item a line
  "${B[@]}" inspect --type image --format "{{range .Docker.Config.$2}}{{println .}}{{end}}" "$1" | sed '/^$/d'
}
run_argv() { config "$1" Entrypoint; config "$1" Cmd; }  # what `docker run IMAGE` runs

bctr=$("${B[@]}" from --pull=never "render-broker:$VERSION"); containers+=("$bctr")
nctr=$("${B[@]}" from --pull=never "render-node:$VERSION"); containers+=("$nctr")
# each image's own USER (10001), ENTRYPOINT (tini) and CMD; the host's network, loopback addresses only.
# tini is not PID 1 here (no PID namespace with chroot isolation): TINI_SUBREAPER lets it reap as it would
mapfile -t argv < <(run_argv "render-broker:$VERSION")
"${B[@]}" run --env TINI_SUBREAPER=1 --env BROKER_HOST=127.0.0.1 --env BROKER_PORT="$PORT" --env BROKER_ADMIN_TOKEN=$ADMIN \
  --env BROKER_NODE_TOKEN=$NODE --env BROKER_SECRET=images-smoke-secret "$bctr" -- "${argv[@]}" \
  > "$WORK/run-broker.log" 2>&1 &
runs+=($!)
deadline=$((SECONDS + 60))
while ((SECONDS < deadline)); do
  curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null || { tail -30 "$WORK/run-broker.log"; echo "broker: no /readyz" >&2; exit 1; }
uid=""
for p in $(in_root "$(run_root "${runs[0]}")"); do
  if tr '\0' ' ' < "/proc/$p/cmdline" | grep -q "^/usr/bin/python3 /usr/local/bin/render-broker serve"; then
    uid=$(awk '/^Uid:/ {print $2}' "/proc/$p/status")
  fi
done
[ "$uid" = 10001 ] || { echo "broker: serve runs as uid '$uid', not 10001" >&2; exit 1; }
healthcheck() {  # healthcheck IMAGE CONTAINER ENV...: run the image's own HEALTHCHECK command in the container
  local image=$1 ctr=$2; shift 2
  mapfile -t check < <(config "$image" Healthcheck.Test)
  [ "${check[0]:-}" = CMD ] || { echo "$image: no HEALTHCHECK CMD (${check[*]:-none})" >&2; return 1; }
  "${B[@]}" run "$@" "$ctr" -- "${check[@]:1}" >&2
  echo "${check[*]:1}"
}
hc=$(healthcheck "render-broker:$VERSION" "$bctr" --env BROKER_PORT="$PORT")
say "broker image: /readyz answers on :$PORT, serve runs as uid $uid, its HEALTHCHECK ($hc) passes"

curl -fsS -X PUT -H "Authorization: Bearer $ADMIN" -H "Content-Type: application/json" \
  -d '{"max_sessions_per_gpu": 1}' "http://127.0.0.1:$PORT/api/v1/pools/desktop" >/dev/null
HEALTH=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mapfile -t argv < <(run_argv "render-node:$VERSION")
"${B[@]}" run --env TINI_SUBREAPER=1 --env NODE_BROKER_URL="http://127.0.0.1:$PORT" --env NODE_NODE_TOKEN=$NODE \
  --env NODE_HOST_ID=image-smoke-node --env NODE_POOL=desktop --env NODE_HEALTH_HOST=127.0.0.1 \
  --env NODE_HEALTH_PORT="$HEALTH" --env NODE_SELFTEST_INTERVAL_S=0 --env NODE_SHUTDOWN_GRACE_S=0 "$nctr" \
  -- "${argv[@]}" > "$WORK/run-node.log" 2>&1 &
runs+=($!)
state="" deadline=$((SECONDS + 60))
while ((SECONDS < deadline)); do
  state=$(curl -fsS -H "Authorization: Bearer $ADMIN" "http://127.0.0.1:$PORT/api/v1/hosts/image-smoke-node" \
          2>/dev/null || true)
  grep -q '"state": "up"' <<<"$state" && grep -q '"alive": true' <<<"$state" && state="up True" && break
  sleep 0.2
done
[ "$state" = "up True" ] || { tail -30 "$WORK/run-node.log"; echo "node: never registered" >&2; exit 1; }
nuid=$(for p in $(in_root "$(run_root "${runs[1]}")"); do
  tr '\0' ' ' < "/proc/$p/cmdline" | grep -q "^/usr/bin/python3 /usr/local/bin/render-node" \
    && awk '/^Uid:/ {print $2}' "/proc/$p/status"; done | head -1)
hc=$(healthcheck "render-node:$VERSION" "$nctr" --env NODE_HEALTH_PORT="$HEALTH")
say "render-node image: host image-smoke-node registered and alive, the node runs as uid $nuid, its HEALTHCHECK ($hc) passes"
say "done in $((SECONDS - t0)) s (logs in $WORK)"
