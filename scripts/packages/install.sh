#!/usr/bin/env bash
# Install the Debian packages of the named lists (scripts/packages/NAME.txt: one package a line, '#'
# comments), skipping those already installed.  scripts/setup.sh and both images (infra/docker) call
# this, so a machine set up by setup.sh and an image carry the same packages.
#   install.sh broker node        install the packages of broker.txt and node.txt
#   install.sh --print node       print them, one a line, install nothing
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
print=0
if [ "${1:-}" = "--print" ]; then print=1; shift; fi
pkgs=()
for list in "$@"; do
  [ -f "$here/$list.txt" ] || { echo "install.sh: no package list $here/$list.txt" >&2; exit 2; }
  while read -r p; do [ -n "$p" ] && pkgs+=("$p"); done < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$here/$list.txt")
done
if ((print)); then printf '%s\n' "${pkgs[@]}"; exit 0; fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install.sh: installing Debian packages: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
