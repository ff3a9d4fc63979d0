#!/usr/bin/env bash
# Install Debian's graphviz when its dot is not on PATH (ferryctl board lays the picture out with it; CI runs as
# root on a fresh machine). Idempotent: does nothing when dot is already there.
set -euo pipefail
if command -v dot >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "graphviz's dot is missing and this is not root: install it with 'apt-get install -y graphviz'" >&2
  exit 1
fi
start=$(date +%s)
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null
echo "installed $(dot -V 2>&1 | head -1) in $(( $(date +%s) - start )) s"
