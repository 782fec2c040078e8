#!/usr/bin/env bash
# The README's first command: installs dependencies, builds only the anvil executable (with the CUDA
# backend it links when nvcc exists; the tests and benchmarks are left to scripts/test.sh), then runs
# the README's demo commands exactly as written there (tests/cli/docs_test.cpp checks that they match).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "demo: building build/anvil (a few minutes on 2 cores; log in build/demo-build.log) ..."
mkdir -p build
if ! BUILD_DIR=build TARGETS=anvil bash scripts/build.sh >build/demo-build.log 2>&1; then
  tail -n 40 build/demo-build.log
  echo "demo: the build failed (full log: build/demo-build.log)" >&2
  exit 1
fi
# Prints the command as the README shows it, then runs it with build/anvil.
run() {
  printf '\n$'; printf ' %q' "$@"; printf '\n'
  "./build/$1" "${@:2}"
}
run anvil generate -m models/anvil-tiny-code-q4 -p $'def fibonacci(n):\n' -n 64
run anvil generate --synthetic tiny:q4g64 -p 'Hello' -n 16 --ignore-eos
