#!/usr/bin/env bash
# The "Priced replicas" tables of docs/BENCHMARKS.md (issue 31), in modelled
# time (every number a pure function of the configuration; the host does not
# enter): bench_ep_layer tables=replica_costs on every hardware preset, for
# four shapes (the default, many tokens per expert, few tokens per expert,
# Mixtral-like), then the planner's cost at E=256 R=64 (bench_balance_planner,
# wall clock), then a summary of the issue's goals over every table row:
#   * priced step never below 1.00x no replicas (B = 0);
#   * >= 1.3x where the busiest rank's compute dominates (listed: every
#     priced row >= 1.3x, and the rows where the balance-only plan is faster
#     than 1.3x but priced is not);
#   * with dedup, post-dedup forward token bytes with priced replicas not
#     more than without.
# Usage: bash bench/priced_replicas.sh [BUILD_DIR]   (default: build)
set -euo pipefail
build=${1:-build}
layer_bench="$build/bench/ep_layer/bench_ep_layer"
planner_bench="$build/bench/balance/bench_balance_planner"
for binary in "$layer_bench" "$planner_bench"; do
  [[ -x "$binary" ]] || { echo "priced_replicas.sh: $binary not built (cmake --build $build)" >&2; exit 1; }
done

shapes=(
  "default shape: R=8, N_l=256, H=256, F=128, E=64, K=8 (32 pairs per expert per rank)|"
  "many tokens per expert: R=8, N_l=1024, H=256, F=256, E=16, K=2 (1024 rows per expert)|tokens_per_rank=1024 hidden=256 ffn=256 experts=16 top_k=2"
  "few tokens per expert (DeepSeek-like K=8 of 64): R=8, N_l=64, H=256, F=128 (64 rows per expert)|tokens_per_rank=64 hidden=256 ffn=128 experts=64 top_k=8"
  "Mixtral-like: R=4, N_l=512, H=512, F=1024, E=8, K=2 (256 rows per expert)|ranks=4 tokens_per_rank=512 hidden=512 ffn=1024 experts=8 top_k=2"
)
tables=$(mktemp)
trap 'rm -f "$tables"' EXIT
for entry in "${shapes[@]}"; do
  title=${entry%%|*}
  shape_args=${entry#*|}
  echo
  echo "#### $title" | tee -a "$tables"
  echo
  echo '```'
  echo "bench_ep_layer clock=modelled tables=replica_costs steps=2 $shape_args"
  echo '```'
  # shellcheck disable=SC2086  # shape_args are separate key=value words
  "$layer_bench" clock=modelled tables=replica_costs steps=2 $shape_args | grep -E '^(###|\|)' |
    sed -e 's/^### \(.*\)$/\n**\1**\n/' | tee -a "$tables"
done

echo
echo "#### Planner cost (wall clock, this machine)"
echo
echo '```'
echo "bench_balance_planner"
"$planner_bench" | head -7
echo '```'

# Summary over the table rows: columns (after splitting on '|'): 2 dispatch,
# 3 hot, 4 B, 5 off us, 6 balance us, 7 x, 8 priced us, 9 x, 11 MB off /
# balance / priced.
echo
echo "#### Goals over every row"
echo
awk -F'|' '
  /^####/ { shape = $0; gsub(/^#### |:.*/, "", shape) }
  /^\*\*/ { preset = $0; gsub(/\*\*|:.*/, "", preset) }
  /^\| (alltoall|ring)/ {
    rows++
    name = shape ", " preset ":" $2 $3 "B" $4
    gsub(/ +/, " ", name)
    gsub(/ :/, ":", name)
    sub(/ $/, "", name)
    priced_x = $9 + 0; balance_x = $7 + 0
    if (priced_x < 1.0) { below++; below_list = below_list "\n  - " name ": " priced_x "x" }
    if (priced_x >= 1.3) winners++
    if (balance_x >= 1.3 && priced_x < 1.3) { missed++; missed_list = missed_list "\n  - " name ": balance " balance_x "x, priced " priced_x "x" }
    if ($2 ~ /dedup/) {
      split($11, mb, "/")
      dedup_rows++
      if (mb[3] + 0 > mb[1] + 0) { more_bytes++; bytes_list = bytes_list "\n  - " name ": " mb[3] + 0 " vs " mb[1] + 0 " MB" }
    }
  }
  END {
    printf "- rows: %d; priced below 1.00x no replicas: %d%s\n", rows, below, below_list
    printf "- priced >= 1.3x: %d rows; balance-only >= 1.3x where priced is not: %d%s\n", winners, missed, missed_list
    printf "- dedup rows: %d; priced sends more forward token bytes than no replicas: %d%s\n", dedup_rows, more_bytes, bytes_list
  }' "$tables"
