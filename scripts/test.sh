#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, and runs every test.
#  1. the Release build and all of its tests (ctest);
#  2. the checkpoint loader, format and quantization tests, the engine's safety, KV pool and
#     randomized differential tests (fixed seed budget; scripts/engine_fuzz.sh runs more seeds), and
#     the durable KV store's unit tests (fault-injecting file layer, corruption, recovery), again
#     under AddressSanitizer + UBSan (a separate build dir).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=build bash scripts/build.sh   # everything: the tests, benchmarks and CUDA library too
(cd build && ctest --output-on-failure -j"$(nproc)")
if [ "${ANVIL_SKIP_ASAN:-0}" != "1" ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DANVIL_ASAN=ON -DANVIL_CUDA=OFF -DANVIL_BUILD_BENCH=OFF >/dev/null
  cmake --build build-asan -j"$(nproc)" --target anvil_test_format anvil_test_quant anvil_test_model anvil_test_runtime \
    anvil_test_kvstore
  (cd build-asan && ctest --output-on-failure -j"$(nproc)" -L "format|quant|kvstore" &&
   ctest --output-on-failure -j"$(nproc)" -R "^BadCheckpoint\.|^EngineSafety\.|^EngineDifferential\.|^KVPool")
fi
