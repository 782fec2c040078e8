#!/usr/bin/env bash
# Same-machine comparison with llama.cpp (CPU), for docs/benchmarks.md. Not part of the tests.
#
# 1. Downloads the llama-cpp-python source distribution from PyPI (it carries llama.cpp's sources)
#    and builds llama-bench and llama-quantize for this CPU (scripts/llamacpp_build.sh).
# 2. Writes the synthetic qwen3-0.6b checkpoint as bf16 with `anvil synth` (the same random-weight
#    model `anvil bench --synthetic qwen3-0.6b:...` builds), converts it to GGUF with llama.cpp's
#    convert_hf_to_gguf.py and quantizes it to Q4_0 twice: --pure (every tensor Q4_0: 4.5 bits per
#    weight, the size of anvil's q4g64) and llama.cpp's default Q4_0 mix (Q6_K output/embedding).
# 3. Runs, back to back: anvil bench (docs/bench-protocol.md; decode follows a 512-token prompt), anvil
#    bench with a 1-token prompt (decode from an empty context), and llama-bench with pp512, tg128
#    at depth 0 and at depth 512.
#
# Usage: scripts/bench_llamacpp.sh [WORKDIR]   (default /tmp/anvil-llamacpp; needs ~3 GB there,
# network access to PyPI, python3 with torch + transformers + numpy, cmake, and ./build/anvil)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/anvil-llamacpp}"
mkdir -p "$WORK"
. scripts/llamacpp_build.sh   # sets SRC, BIN

MODEL="$WORK/qwen3-0.6b-bf16"
[ -f "$MODEL/config.json" ] || "$ANVIL" synth --shape qwen3-0.6b --quant bf16 --out "$MODEL"
[ -f "$WORK/q06.f16.gguf" ] || python3 "$SRC/convert_hf_to_gguf.py" "$MODEL" --outtype f16 --outfile "$WORK/q06.f16.gguf"
[ -f "$WORK/q06.q4_0pure.gguf" ] || "$BIN/llama-quantize" --pure "$WORK/q06.f16.gguf" "$WORK/q06.q4_0pure.gguf" Q4_0
[ -f "$WORK/q06.q4_0.gguf" ] || "$BIN/llama-quantize" "$WORK/q06.f16.gguf" "$WORK/q06.q4_0.gguf" Q4_0

T="$(nproc)"
echo "== anvil bench --synthetic qwen3-0.6b:q4g64 (prompt 512, decode 128, best of 3)"
"$ANVIL" bench --synthetic qwen3-0.6b:q4g64 -t "$T"
echo "== anvil bench --synthetic qwen3-0.6b:q4g64 --prompt 1 (decode from an empty context)"
"$ANVIL" bench --synthetic qwen3-0.6b:q4g64 -t "$T" --prompt 1
echo "== llama-bench, Q4_0 --pure (mean of 3)"
"$BIN/llama-bench" -m "$WORK/q06.q4_0pure.gguf" -t "$T" -p 512 -n 128 -d 0,512 -r 3
echo "== llama-bench, Q4_0 default mix (mean of 3)"
"$BIN/llama-bench" -m "$WORK/q06.q4_0.gguf" -t "$T" -p 512 -n 128 -d 0,512 -r 3
