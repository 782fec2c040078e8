# Sourced by scripts/cuda_ab_env.sh and scripts/cuda_ab_commit.sh (bash, on the GPU machine).
# ab_bench ROUND MODEL LABEL BIN ARGS ENV...: one `BIN bench --device cuda --synthetic MODEL ARGS`
# under the variables ENV..., its decode line appended to $OUT/ab_runs.txt and its tok/s added to
# the caller's associative arrays sum[MODEL,LABEL] and cnt[MODEL,LABEL] (declare -A sum cnt).
ab_bench() {
  local r=$1 m=$2 label=$3 bin=$4 args=$5 line v
  shift 5
  # shellcheck disable=SC2086
  line=$(env "$@" timeout 120 "$bin" bench --device cuda --synthetic "$m" $args 2>&1 | grep -E '^decode')
  echo "round $r $m $label: $line" | tee -a "$OUT/ab_runs.txt"
  v=$(echo "$line" | grep -oE '[0-9]+\.[0-9]+' | head -1)
  if [ -n "$v" ]; then
    sum[$m,$label]=$(awk -v s="${sum[$m,$label]:-0}" -v v="$v" 'BEGIN { printf "%.4f", s + v }')
    cnt[$m,$label]=$(( ${cnt[$m,$label]:-0} + 1 ))
  fi
}
