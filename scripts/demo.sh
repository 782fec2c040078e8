#!/usr/bin/env bash
# The README's first command: installs dependencies, builds anvil, and generates Python code with
# the bundled 12.6M-parameter model (models/anvil-tiny-code-q4, MLX 4-bit), then runs the same
# generation on a synthetic random-weight Qwen3 model built in memory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=build bash scripts/build.sh
echo "== anvil generate -m models/anvil-tiny-code-q4 -p 'def fibonacci(n):' -n 64"
./build/anvil generate -m models/anvil-tiny-code-q4 -p $'def fibonacci(n):\n' -n 64
echo "== anvil generate --synthetic tiny:q4g64 -p 'Hello' -n 16   (random weights: the text is noise)"
./build/anvil generate --synthetic tiny:q4g64 -p "Hello" -n 16 --ignore-eos
