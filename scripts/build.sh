#!/usr/bin/env bash
# Configures and builds anvil into ${BUILD_DIR:-build} (Release). Extra arguments go to cmake.
# TARGETS="anvil ..." builds only those targets (default: everything: tests, benchmarks, CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@" >/dev/null
# shellcheck disable=SC2086  # TARGETS is a word list
cmake --build "$BUILD_DIR" -j"$(nproc)" ${TARGETS:+--target $TARGETS}
