#!/usr/bin/env bash
# The engine's randomized differential test (tests/runtime/engine_differential_test.cpp) over many
# seeds, under AddressSanitizer + UBSan (build-asan). CI runs 4 seeds; this runs SEEDS (default 200)
# starting at FIRST (default 1000) with STEPS steps each (default 120).
#   scripts/engine_fuzz.sh [SEEDS] [FIRST] [STEPS]
# A failure names its seed; re-run just that one with ANVIL_DIFF_SEEDS=1 ANVIL_DIFF_SEED=<seed>.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${1:-200} FIRST=${2:-1000} STEPS=${3:-120}
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DANVIL_ASAN=ON -DANVIL_CUDA=OFF -DANVIL_BUILD_BENCH=OFF >/dev/null
cmake --build build-asan -j"$(nproc)" --target anvil_test_runtime
ANVIL_DIFF_SEEDS=$SEEDS ANVIL_DIFF_SEED=$FIRST ANVIL_DIFF_STEPS=$STEPS \
  ./build-asan/tests/anvil_test_runtime --gtest_filter='EngineDifferential.*:EngineSafety.*:KVPool*'
