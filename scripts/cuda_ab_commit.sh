#!/usr/bin/env bash
# Decode speed of this tree against another commit's, on the GPU machine, in one device call.
#
#   here:     bash scripts/cuda_ab_commit.sh prepare BASE
#             writes .ab-base/base.tar: BASE's src/ and CMakeLists.txt (git archive), and
#             .ab-base/commit. .ab-base/ is git-ignored, so the device call carries it:
#             carry [".devdeps", ".ab-base"].
#   device:   bash scripts/cuda_ab_commit.sh run
#             copies this tree to /tmp/ab-base with BASE's src/ and CMakeLists.txt in place of its
#             own (files BASE lacks are gone, files it has come back), builds `anvil` in both trees
#             at once (build-gpu here, incrementally; /tmp/ab-base/build-gpu there), then
#             decodes each of AB_MODELS in AB_ROUNDS rounds, the two builds taking turns (which goes
#             first alternates by round, so a drifting clock favours neither), and prints each
#             model's figures and the mean change. Logs under $OUT (or ./cuda-out).
#
# AB_MODELS   synthetic models (default "qwen3-0.6b:q4g64 qwen3-8b:q4g64")
# AB_ROUNDS   rounds (default 3)
# AB_ARGS     anvil bench arguments (default "-n 128 --runs 3": tg128 after 512 tokens, best of 3)
# AB_ENV      environment for both builds' runs (e.g. "ANVIL_CUDA_ROPE_ATTN=1"), space-separated
# AB_ENV_C    a third variant: this tree's build run with these variables too ("this+"), in the same rounds
# AB_TESTS    a gtest filter: this tree also builds anvil_test_cuda and runs it before the rounds
# Session 45 measured the cluster merge's one-round-trip loads this way (docs/benchmarks.md).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda_ab_lib.sh
what=${1:-}
if [ "$what" = prepare ]; then
  base=${2:?usage: cuda_ab_commit.sh prepare BASE}
  commit=$(git rev-parse --verify "$base^{commit}") || exit 1
  mkdir -p .ab-base
  git archive --format=tar "$commit" src CMakeLists.txt > .ab-base/base.tar || exit 1
  echo "$commit" > .ab-base/commit
  echo "prepared $(git log -1 --format='%h %s' "$commit" | cut -c1-100) ($(du -h .ab-base/base.tar | cut -f1)); carry .ab-base"
  exit 0
fi
if [ "$what" != run ]; then
  echo "usage: cuda_ab_commit.sh prepare BASE | run" >&2
  exit 2
fi
[ -f .ab-base/base.tar ] || { echo "no .ab-base/base.tar: run 'cuda_ab_commit.sh prepare BASE' here and carry .ab-base" >&2; exit 1; }
[ -f .devdeps/env.sh ] && source .devdeps/env.sh
command -v zstd > /dev/null || { [ -x .devdeps/bin/zstd ] && export PATH="$PWD/.devdeps/bin:$PATH"; }
OUT=${OUT:-$PWD/cuda-out}
mkdir -p "$OUT"
t0=$(date +%s)
base_dir=/tmp/ab-base
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; echo "base $(cat .ab-base/commit)"; } |
  tee "$OUT/ab_machine.txt"
rm -rf "$base_dir"
mkdir -p "$base_dir"
tar --exclude='./build*' --exclude=./.devdeps --exclude=./.ab-base --exclude=./cuda-out -cf - . | tar -C "$base_dir" -xf -
rm -rf "$base_dir/src" "$base_dir/CMakeLists.txt"
tar -C "$base_dir" -xf .ab-base/base.tar
cfg=(-G Ninja -DANVIL_CUDA=ON -DANVIL_CUDA_ARCHS=90a -DCMAKE_BUILD_TYPE=Release -DANVIL_BUILD_BENCH=OFF)
build() {  # dir, log, targets (space-separated)
  # shellcheck disable=SC2086
  (cd "$1" && cmake -S . -B build-gpu "${cfg[@]}" > "$2" 2>&1 && cmake --build build-gpu -j8 --target $3 >> "$2" 2>&1)
}
build "$PWD" "$OUT/ab_build_this.log" "anvil${AB_TESTS:+ anvil_test_cuda}" &
this_pid=$!
build "$base_dir" "$OUT/ab_build_base.log" anvil &
base_pid=$!
wait $this_pid || { echo "this tree's build failed:"; tail -30 "$OUT/ab_build_this.log"; exit 1; }
wait $base_pid || { echo "the base's build failed:"; tail -30 "$OUT/ab_build_base.log"; exit 1; }
echo "built both in $(( $(date +%s) - t0 )) s"
if [ -n "${AB_TESTS:-}" ]; then
  timeout 300 ./build-gpu/tests/anvil_test_cuda --gtest_filter="$AB_TESTS" > "$OUT/ab_tests.log" 2>&1
  echo "tests ($AB_TESTS): rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/ab_tests.log" | tr '\n' ' ')"
  grep -E "^\[  FAILED" "$OUT/ab_tests.log" | head
fi
declare -A sum cnt
for r in $(seq 1 "${AB_ROUNDS:-3}"); do
  order="this base${AB_ENV_C:+ this+}"
  [ $((r % 2)) = 0 ] && order="${AB_ENV_C:+this+ }base this"
  for m in ${AB_MODELS:-qwen3-0.6b:q4g64 qwen3-8b:q4g64}; do
    for b in $order; do
      bin=./build-gpu/anvil
      [ "$b" = base ] && bin=$base_dir/build-gpu/anvil
      extra=""
      [ "$b" = this+ ] && extra=$AB_ENV_C
      # shellcheck disable=SC2086
      ab_bench "$r" "$m" "$b" "$bin" "${AB_ARGS:--n 128 --runs 3}" ${AB_ENV:-} $extra
    done
  done
done
echo "=== decode tok/s, mean over rounds (this tree against $(cut -c1-12 .ab-base/commit)) ==="
for m in ${AB_MODELS:-qwen3-0.6b:q4g64 qwen3-8b:q4g64}; do
  if [ -n "${cnt[$m,this]:-}" ] && [ -n "${cnt[$m,base]:-}" ]; then
    awk -v m="$m" -v a="${sum[$m,this]}" -v na="${cnt[$m,this]}" -v b="${sum[$m,base]}" -v nb="${cnt[$m,base]}" \
      'BEGIN { printf "%-28s this %9.1f  base %9.1f  change %+6.2f%%\n", m, a / na, b / nb, (a / na) / (b / nb) * 100 - 100 }'
  else
    echo "$m: runs missing (see $OUT/ab_runs.txt)"
  fi
  if [ -n "${AB_ENV_C:-}" ] && [ -n "${cnt[$m,this+]:-}" ] && [ -n "${cnt[$m,base]:-}" ]; then
    awk -v m="$m" -v a="${sum[$m,this+]}" -v na="${cnt[$m,this+]}" -v b="${sum[$m,base]}" -v nb="${cnt[$m,base]}" \
      -v e="$AB_ENV_C" 'BEGIN { printf "%-28s this+ %8.1f  base %9.1f  change %+6.2f%%  (this+: %s)\n", m, a / na, b / nb, (a / na) / (b / nb) * 100 - 100, e }'
  fi
done
echo "total $(( $(date +%s) - t0 )) s"
