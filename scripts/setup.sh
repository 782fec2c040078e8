#!/usr/bin/env bash
# Installs every Debian package anvil's build and tests need. Safe to re-run.
# The CUDA toolkit is optional: when nvcc is on PATH (or in /usr/local/cuda/bin) the CUDA backend
# is compiled too.
set -euo pipefail
PKGS=(build-essential cmake pkg-config git python3
      nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev libxxhash-dev
      libcpp-httplib-dev libzstd-dev zstd libsqlite3-dev
      libgtest-dev libgmock-dev libbenchmark-dev tmux)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}"
fi
echo "setup: dependencies present"
