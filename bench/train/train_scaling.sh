#!/usr/bin/env bash
# Training tokens/s across ranks (issue 15's goal: 2 ranks >= 0.9 of 1 rank,
# 4 ranks >= 0.8): `epmoe train` with its defaults at ranks=1, 2, 4, the
# median tokens/s over steps after the first `skip` (warm-up), and each rank
# count's ratio to one rank, measured in the same run. Extra KEY=VALUE
# arguments go to every run (clock=modelled for the modelled clock's
# tokens/s, shared_expert_ffn=256, ...).
#
# Usage: bench/train/train_scaling.sh [BUILD_DIR] [steps] [KEY=VALUE...]   (defaults: build 150)
# Needs python3 (to read metrics.jsonl).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
steps=${2:-150}
shift $(( $# < 2 ? $# : 2 ))
skip=$(( steps > 60 ? 30 : steps / 4 ))
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "epmoe train $*, $steps steps (median over steps > $skip); $(lscpu | grep 'Model name' | sed 's/  */ /g'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-6s %12s %8s   %s\n" ranks "tok/s" "vs 1" "median phase ms (us with clock=modelled), rank 0: forward backward grad_all_reduce metrics_exchange"
for ranks in 1 2 4; do
  "$build/epmoe" train steps="$steps" ranks="$ranks" progress=off metrics_file="$out/$ranks.jsonl" "$@" > /dev/null
  python3 - "$out" "$ranks" "$skip" <<'PY'
import json, statistics, sys
out, ranks, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
steady = [l for l in map(json.loads, open(f"{out}/{ranks}.jsonl")) if l["step"] > skip]
modelled = steady[0].get("modelled") is not None
tps = statistics.median((l["modelled"] if modelled else l)["tokens_per_second"] for l in steady)
if ranks == 1:
    open(f"{out}/base", "w").write(repr(tps))
base = float(open(f"{out}/base").read())
# clock=modelled: phases are modelled seconds, printed in microseconds.
unit = 1e6 if modelled else 1e3
phase = lambda name: unit * statistics.median(l["phase_seconds"].get(name, 0.0) for l in steady)
print(f"{ranks:<6} {tps:12.0f} {tps / base:8.2f}   {phase('forward'):.1f} {phase('backward'):.1f} "
      f"{phase('gradient_all_reduce'):.1f} {phase('metrics_exchange'):.1f}")
PY
done
