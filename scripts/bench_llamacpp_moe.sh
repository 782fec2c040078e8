#!/usr/bin/env bash
# Same-machine comparison with llama.cpp (CPU) on the MoE shape qwen3-30b-a3b-16L (16 of
# Qwen3-30B-A3B's 48 layers, 128 experts, top-8), for docs/benchmarks.md. Not part of the tests.
#
# 1. Builds llama-bench and llama-quantize (scripts/llamacpp_build.sh, as bench_llamacpp.sh).
# 2. Writes the GGUF: `anvil synth --config-only` gives anvil's config.json for the shape plus the
#    Qwen3 tokenizer, and scripts/llamacpp_synth_moe.py runs llama.cpp's own Qwen3-MoE converter
#    on it with random weights, writing the Q4_0 `--pure` file directly (every weight Q4_0, 4.5 bits
#    per weight like anvil's q4g64; the router F32, as llama-quantize leaves it). The bf16 route of
#    bench_llamacpp.sh (synth bf16 -> convert f16 -> llama-quantize) does not fit here: 21 GB of bf16
#    built in memory on a 24 GB machine. Step 2b checks, on the tiny-moe shape, that the direct file
#    has exactly the tensors (names, types, shapes) that the f16 + `llama-quantize --pure Q4_0` route
#    gives.
# 3. Runs, back to back, printing the load average before and after each: anvil bench (prompt 512,
#    decode 128, best of RUNS), anvil bench --prompt 1 (decode from an empty context), and
#    llama-bench pp512 / tg128 at depth 0 and 512 (mean of RUNS).
#
# Usage: scripts/bench_llamacpp_moe.sh [WORKDIR]   (default /tmp/anvil-llamacpp; needs ~7 GB there
# and ~7 GB of memory, python3 with torch + transformers + numpy, cmake, and ./build/anvil)
# Environment: RUNS (default 3), THREADS (default nproc), ANVIL_ONLY=1 / LLAMA_ONLY=1 for one side.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${1:-/tmp/anvil-llamacpp}"
ANVIL=./build/anvil
[ -x "$ANVIL" ] || { echo "error: $ANVIL not found; run scripts/build.sh first" >&2; exit 1; }
mkdir -p "$WORK"
. scripts/llamacpp_build.sh   # sets SRC, BIN
SHAPE=qwen3-30b-a3b-16L
GGUF="$WORK/$SHAPE.q4_0pure.gguf"

# 2b. The direct Q4_0 writer against the f16 + llama-quantize route, on the tiny-moe shape (seconds).
TINY="$WORK/tiny-moe-config"
if [ ! -f "$WORK/tiny-moe.checked" ]; then
  rm -rf "$TINY"
  "$ANVIL" synth --shape tiny-moe --quant bf16 --config-only --out "$TINY"
  python3 scripts/llamacpp_synth_moe.py "$SRC" "$TINY" "$WORK/tiny-moe.f16.gguf" --outtype f16 2>/dev/null
  "$BIN/llama-quantize" --pure "$WORK/tiny-moe.f16.gguf" "$WORK/tiny-moe.quantized.gguf" Q4_0 >/dev/null 2>&1
  python3 scripts/llamacpp_synth_moe.py "$SRC" "$TINY" "$WORK/tiny-moe.direct.gguf" 2>/dev/null
  PYTHONPATH="$SRC/gguf-py" python3 - "$WORK/tiny-moe.quantized.gguf" "$WORK/tiny-moe.direct.gguf" <<'PY'
import sys
from gguf import GGUFReader
a, b = ({t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape)) for t in GGUFReader(p).tensors}
        for p in sys.argv[1:3])
if a != b:
    for n in sorted(set(a) | set(b)):
        if a.get(n) != b.get(n):
            print(f"  {n}: llama-quantize {a.get(n)}, direct {b.get(n)}")
    sys.exit("error: the direct Q4_0 GGUF differs from llama-quantize --pure's")
print(f"tiny-moe: the direct Q4_0 GGUF has the same {len(a)} tensors (names, types, shapes) as llama-quantize --pure's")
PY
  touch "$WORK/tiny-moe.checked"
fi

if [ ! -f "$GGUF" ]; then
  MODEL="$WORK/$SHAPE-config"
  rm -rf "$MODEL"
  "$ANVIL" synth --shape "$SHAPE" --quant bf16 --config-only --out "$MODEL"
  python3 scripts/llamacpp_synth_moe.py "$SRC" "$MODEL" "$GGUF.tmp" 2>&1 | grep -v '^INFO:hf-to-gguf:blk' | tail -5
  mv "$GGUF.tmp" "$GGUF"
fi

T="${THREADS:-$(nproc)}"
R="${RUNS:-3}"
load() { echo "   load average: $(cut -d' ' -f1-3 /proc/loadavg)"; }
if [ -z "${LLAMA_ONLY:-}" ]; then
  echo "== anvil bench --synthetic $SHAPE:q4g64 (prompt 512, decode 128, best of $R)"; load
  "$ANVIL" bench --synthetic "$SHAPE:q4g64" -t "$T" --runs "$R"; load
  echo "== anvil bench --synthetic $SHAPE:q4g64 --prompt 1 (decode from an empty context)"; load
  "$ANVIL" bench --synthetic "$SHAPE:q4g64" -t "$T" --runs "$R" --prompt-tokens 1; load
fi
if [ -z "${ANVIL_ONLY:-}" ]; then
  echo "== llama-bench, Q4_0 --pure (mean of $R)"; load
  "$BIN/llama-bench" -m "$GGUF" -t "$T" -p 512 -n 128 -d 0,512 -r "$R"; load
fi
