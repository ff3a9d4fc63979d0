#!/usr/bin/env bash
# Install Debian's etcd-server when no etcd binary is on PATH (CI runs as root on a fresh machine).
set -euo pipefail
if command -v etcd >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != "0" ]; then
  echo "etcd is missing and this is not root: install it with 'apt-get install -y etcd-server'" >&2
  exit 1
fi
start=$(date +%s)
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client >/dev/null
echo "installed $(etcd --version | head -1) in $(( $(date +%s) - start )) s"
