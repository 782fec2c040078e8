#!/usr/bin/env bash
# Decode speed under environment switches, against the defaults, on one build, in one device call:
#   bash scripts/cuda_ab_env.sh            (on the GPU machine; carry [".devdeps"])
# builds `anvil` and anvil_test_cuda (build-gpu; EXTRA_TARGETS more), runs TESTS (a gtest filter for
# anvil_test_cuda) and, with GOLDEN=1, the golden models on CUDA (then anvil_test_model is built too),
# then decodes each of MODELS in ROUNDS rounds under A (the defaults), B (ENV_B) and C (ENV_C, if
# set), the order reversed every other round, and prints the mean change against A per model.
# With TRACE_ENV set, a trace build (build-gpu-t, compiled beside the tests) gives one traced replay
# of each model under TRACE_ENV, summarized by scripts/trace_summary.py. Logs under $OUT (or ./cuda-out).
#
# MODELS   synthetic models (default "qwen3-0.6b:q4g64 qwen3-8b:q4g64")
# ROUNDS   rounds (default 3)
# ARGS     anvil bench arguments (default "-n 128 --runs 3": tg128 after 512 tokens, best of 3)
# ENV_B .. ENV_E   space-separated VAR=VALUE lists (ENV_B required; C, D and E optional variants)
# TESTS_ENV  also run TESTS once more under these variables (space-separated VAR=VALUE)
# SKIP_C_SMALL=1 runs C only on models without "0.6b" in their name.
# With .prebuilt carried (scripts/cuda_prebuilt.sh pack, here) and matching this tree, nothing is built.
# Session 46 measured the fused layer flow this way (docs/benchmarks.md).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_ab_lib.sh
: "${ENV_B:?set ENV_B, e.g. ENV_B=ANVIL_CUDA_FUSE=0}"
if [ -f .devdeps/env.sh ]; then source .devdeps/env.sh; elif [ -f .prebuilt/env.sh ]; then source .prebuilt/env.sh; fi
command -v zstd > /dev/null || { [ -x .devdeps/bin/zstd ] && export PATH="$PWD/.devdeps/bin:$PATH"; }
OUT=${OUT:-$PWD/cuda-out}
mkdir -p "$OUT"
t0=$(date +%s)
targets="anvil anvil_test_cuda ${EXTRA_TARGETS:-}"
[ -n "${GOLDEN:-}" ] && targets="$targets anvil_test_model"
# A pack made here from this tree (scripts/cuda_prebuilt.sh, carried as .prebuilt) holding every target
# saves the build.
# shellcheck disable=SC2086
if [ -f .prebuilt/stamp ] && bash scripts/cuda_prebuilt.sh unpack $targets >> "$OUT/build.log" 2>&1; then
  echo "prebuilt binaries unpacked in $(( $(date +%s) - t0 )) s"
  prebuilt_hash=$(sed -n 's/^hash=//p' .prebuilt/stamp)
else
  cmake -S . -B build-gpu -G Ninja -DANVIL_CUDA=ON -DANVIL_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release \
    -DANVIL_BUILD_BENCH=OFF > "$OUT/build.log" 2>&1 &&
    cmake --build build-gpu -j16 --target $targets >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  echo "built in $(( $(date +%s) - t0 )) s"
fi
tpid=
if [ -n "${TRACE_ENV:-}" ] && [ -n "${prebuilt_hash:-}" ] && grep -q '^trace=1$' .prebuilt/stamp; then
  echo "trace build: the prebuilt one"
elif [ -n "${TRACE_ENV:-}" ]; then
  (cmake -S . -B build-gpu-t -G Ninja -DANVIL_CUDA=ON -DANVIL_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release \
    -DANVIL_BUILD_BENCH=OFF -DANVIL_BUILD_TESTS=OFF -DCMAKE_CUDA_FLAGS=-DANVIL_CUDA_TRACE > "$OUT/build_t.log" 2>&1 &&
    cmake --build build-gpu-t -j10 --target anvil >> "$OUT/build_t.log" 2>&1) &
  tpid=$!
fi
if [ -n "${TESTS:-}" ]; then
  timeout 300 ./build-gpu/tests/anvil_test_cuda --gtest_filter="$TESTS" > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure|against the CPU" "$OUT/tests.log" | head -40
  if [ -n "${TESTS_ENV:-}" ]; then
    # shellcheck disable=SC2086
    env $TESTS_ENV timeout 300 ./build-gpu/tests/anvil_test_cuda --gtest_filter="$TESTS" > "$OUT/tests_env.log" 2>&1
    echo "tests under $TESTS_ENV: rc=$?"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED|Failure" "$OUT/tests_env.log" | head -20
  fi
fi
if [ -n "${GOLDEN:-}" ]; then
  timeout 200 ./build-gpu/tests/anvil_test_model --gtest_filter='*Golden*Cuda*' > "$OUT/golden.log" 2>&1
  echo "golden on CUDA: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/golden.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED" "$OUT/golden.log" | head
fi
[ -n "$tpid" ] && { wait "$tpid"; echo "trace build rc=$? at $(( $(date +%s) - t0 )) s"; }
models=${MODELS:-qwen3-0.6b:q4g64 qwen3-8b:q4g64}
declare -A sum cnt
vars="A B"
[ -n "${ENV_C:-}" ] && vars="$vars C"
[ -n "${ENV_D:-}" ] && vars="$vars D"
[ -n "${ENV_E:-}" ] && vars="$vars E"
for r in $(seq 1 "${ROUNDS:-3}"); do
  order=$vars
  [ $((r % 2)) = 0 ] && order=$(echo "$vars" | tr ' ' '\n' | tac | tr '\n' ' ')
  for m in $models; do
    for b in $order; do
      e=""
      [ "$b" = B ] && e="$ENV_B"
      [ "$b" = C ] && e="$ENV_C"
      [ "$b" = D ] && e="$ENV_D"
      [ "$b" = E ] && e="$ENV_E"
      if [ "$b" = C ] && [ -n "${SKIP_C_SMALL:-}" ]; then case "$m" in *0.6b*) continue ;; esac; fi
      # shellcheck disable=SC2086
      ab_bench "$r" "$m" "$b" ./build-gpu/anvil "${ARGS:--n 128 --runs 3}" $e
    done
  done
done
echo "=== decode tok/s, mean over rounds; A: defaults, B: $ENV_B${ENV_C:+, C: $ENV_C}${ENV_D:+, D: $ENV_D}${ENV_E:+, E: $ENV_E} ==="
for m in $models; do
  for b in $vars; do
    [ -n "${cnt[$m,$b]:-}" ] && [ -n "${cnt[$m,A]:-}" ] || continue
    awk -v m="$m" -v b="$b" -v a="${sum[$m,A]}" -v na="${cnt[$m,A]}" -v x="${sum[$m,$b]}" -v nx="${cnt[$m,$b]}" \
      'BEGIN { printf "%-24s %s %9.1f  change against A %+6.2f%%\n", m, b, x / nx, (x / nx) / (a / na) * 100 - 100 }'
  done
done
if [ -n "${TRACE_ENV:-}" ]; then
  mkdir -p "$OUT/trace"
  for m in $models; do
    t=$OUT/trace/${m%%:*}
    # shellcheck disable=SC2086
    env $TRACE_ENV ANVIL_CUDA_TRACE="$t" timeout 100 ./build-gpu-t/anvil bench --device cuda --synthetic "$m" -n 64 --runs 1 2>&1 |
      grep -E 'trace:'
    for f in "$t".*.txt; do
      [ -f "$f" ] || continue
      python3 scripts/trace_summary.py "$f" > "${f%.txt}.summary" 2>&1 && head -40 "${f%.txt}.summary"
      rm -f "$f"
    done
  done
fi
echo "total $(( $(date +%s) - t0 )) s"
