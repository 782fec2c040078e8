#!/usr/bin/env bash
# Durable KV store benchmarks (issue 10; figures in docs/benchmarks.md):
#  1. decode with the store off and on, back to back in one process (anvil bench-kv);
#  2. time to first token for a PROMPT-token prompt: recomputed (store off) against served from the
#     store by a new process (a restart), with the restore bandwidth and its two ceilings
#     (sequential read of the store's segment files, host memcpy = the CPU "host->device" copy);
#  3. open + first lookup of a store holding 100,000 pages.
# Usage: scripts/bench_kv.sh [MODEL_SPEC] (default qwen3-0.6b:q4g64); PROMPT=4096, PAIRS=3 and
# STEPS=123 (which of the three to run) by default; STEPS=4: the in-process restore bandwidth
# (anvil bench-kv --restore-pages, CPU) against its two ceilings.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${ANVIL:-build/anvil}
MODEL=${1:-qwen3-0.6b:q4g64}
DEVICE=${DEVICE:-cpu}   # cuda: the store on the GPU (the H200 figures in docs/benchmarks.md)
PROMPT=${PROMPT:-4096}
OUT=${OUT:-/tmp/anvil-bench-kv}
mkdir -p "$OUT"
echo "== commit $(git rev-parse --short HEAD), $(date -u +%F), $(nproc) cores"
STEPS=${STEPS:-123}
if [[ $STEPS == *1* ]]; then
echo "== 1. decode overhead (store on vs off, back to back)"
"$BIN" bench-kv --device "$DEVICE" --synthetic "$MODEL" --pairs "${PAIRS:-3}" --json --kv-store "$OUT/overhead" | tee "$OUT/overhead.json"
fi
if [[ $STEPS == *2* ]]; then
echo "== 2. TTFT restore vs recompute, ${PROMPT}-token prompt"
STORE="$OUT/ttft"
rm -rf "$STORE"
IDS=$(python3 -c "import random; r=random.Random(0); print(','.join(str(r.randrange(151936)) for _ in range($PROMPT)))")
CTX=$((PROMPT + 64))
"$BIN" generate --device "$DEVICE" --synthetic "$MODEL" --ids "$IDS" -n 1 --ctx $CTX --no-kv-store --json | tail -1 > "$OUT/recompute.json"
"$BIN" generate --device "$DEVICE" --synthetic "$MODEL" --ids "$IDS" -n 1 --ctx $CTX --kv-store "$STORE" --json | tail -1 > "$OUT/first.json"
"$BIN" generate --device "$DEVICE" --synthetic "$MODEL" --ids "$IDS" -n 1 --ctx $CTX --kv-store "$STORE" --json --profile | tail -1 > "$OUT/restore.json"
python3 - "$OUT" "$STORE" <<'PY'
import json, sys, os, time, glob
import numpy as np
out, store = sys.argv[1], sys.argv[2]
rc = json.load(open(out + "/recompute.json")); rs = json.load(open(out + "/restore.json"))
t_rc, t_rs = rc["timings"]["prefill_s"], rs["timings"]["prefill_s"]
kv = rs["kv_store"]
bw = kv["restored_bytes"] / (kv["restore_ms"] / 1e3) / 1e9 if kv["restore_ms"] else 0
buf = bytearray(1 << 24)  # one reused buffer: a fresh one per read would time page faults too
t = time.time(); n = 0
for f in sorted(glob.glob(store + "/seg-*.kv")):
    with open(f, "rb", buffering=0) as fh:
        while True:
            r = fh.readinto(buf)
            if not r: break
            n += r
read_gbs = n / (time.time() - t) / 1e9
a = np.ones(1 << 28, np.uint8); b = np.empty_like(a)
t = time.time()
for _ in range(4): np.copyto(b, a)
copy_gbs = 4 * a.nbytes / (time.time() - t) / 1e9
print(json.dumps({"prompt_tokens": rc["prompt_tokens"], "ttft_recompute_s": t_rc, "ttft_restore_s": t_rs,
                  "restore_over_recompute": t_rs / t_rc, "store_prompt_tokens": rs["store_prompt_tokens"],
                  "same_first_token": rc["ids"] == rs["ids"], "restored_bytes": kv["restored_bytes"],
                  "restore_ms": kv["restore_ms"], "restore_gb_s": bw, "segment_read_gb_s_warm_cache": read_gbs,
                  "host_copy_gb_s": copy_gbs}, indent=1))
PY
fi
if [[ $STEPS == *4* ]]; then
echo "== 4. restore bandwidth in one process (256 pages of qwen3-0.6b KV, page cache warm)"
"$BIN" bench-kv --restore-pages 256 --reps 3 --json --kv-store "$OUT/restore"
fi
if [[ $STEPS == *3* ]]; then
echo "== 3. open + first lookup with 100,000 pages"
"$BIN" bench-kv --open-lookup 100000 --kv-store "$OUT/open" --json
fi
