#!/usr/bin/env bash
# Installs every Debian package anvil's build and tests need. Safe to re-run.
# The CUDA toolkit is optional: when nvcc is on PATH (or in /usr/local/cuda/bin) the CUDA backend
# is compiled too.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential cmake pkg-config git python3
      nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev libxxhash-dev
      libcpp-httplib-dev libzstd-dev zstd libsqlite3-dev
      libgtest-dev libgmock-dev libbenchmark-dev tmux
      chromium)  # headless, for the server's chat-page test
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
# The official openai Python client, for the server's compatibility test
# (tests/server/openai_client_check.py), from PyPI into .pydeps/ (git-ignored; the test puts it on
# PYTHONPATH). Without it that test skips and says so; a failed download warns but does not stop
# the build.
if ! PYTHONPATH=.pydeps python3 -c "import openai" 2>/dev/null; then
  echo "setup: installing the openai Python client into .pydeps/"
  python3 -m pip install -q --disable-pip-version-check --no-input --target .pydeps "openai>=1,<4" ||
    echo "setup: WARNING: could not install the openai client; Http.OpenAIPythonClient will skip"
fi
echo "setup: dependencies present"
