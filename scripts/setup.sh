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
# Python packages that tests run as independent references, from PyPI into .pydeps/ (git-ignored;
# ctest puts it on PYTHONPATH): the official openai client (Http.OpenAIPythonClient), safetensors and
# numpy (the KV store's records and `anvil kv export` read back), tokenizers (SentencePiece-model
# decoding). Without them those tests skip and say so; a failed download warns but does not stop
# the build.
PY_SPECS=("openai:openai>=1,<4" "numpy:numpy" "safetensors:safetensors" "tokenizers:tokenizers")  # module:requirement
py_missing() { for spec in "${PY_SPECS[@]}"; do PYTHONPATH=.pydeps python3 -c "import ${spec%%:*}" 2>/dev/null || echo "$spec"; done; }
mapfile -t PY_NEEDED < <(py_missing)
if [ ${#PY_NEEDED[@]} -gt 0 ]; then
  echo "setup: installing ${PY_NEEDED[*]#*:} into .pydeps/"
  python3 -m pip install -q --disable-pip-version-check --no-input --target .pydeps "${PY_NEEDED[@]#*:}" 2>&1 |
    grep -v -E "^(WARNING: Running pip as|WARNING: Target directory|ERROR: pip's dependency resolver|.* requires .*, but you have .* which is incompatible)" || true
  for spec in $(py_missing); do
    echo "setup: WARNING: python package ${spec%%:*} is missing; the tests that need it will skip"
  done
fi
echo "setup: dependencies present"
