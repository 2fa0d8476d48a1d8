#!/usr/bin/env bash
# Throughput of `epmoe train` (the README's default run: 2-layer MoE LM,
# E=16, top-2, H=128, F=256, Zipf tokens, 4 ranks) per dispatcher and with
# replica balancing off / dynamic / periodic, on threads and under mpirun.
#
# For each configuration: the median tokens/s over steps after the first
# `skip` (warm-up: page faults, oneDNN primitive creation), and two ratios
# measured in the same run:
#   vs 1 rank   the same model on one rank (no expert parallelism, no
#               communication; the 4 ranks share the same 2 cores)
#   of sgemm    model FLOP/s (6 x active parameters per token) over one large
#               fp32 matmul on all cores (bench_moe_layer's), the practical peak
# plus the busiest rank's load over the mean after balancing (layer average).
#
# Usage: bench/train/train_throughput.sh [BUILD_DIR] [steps]   (defaults: build 150)
# Needs python3 (to read metrics.jsonl) and a build with benchmarks.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
steps=${2:-150}
skip=30
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

peak=$("$build/bench/bench_moe_layer" json=true compute_dtype=f32 tokens=2048 hidden=1024 ffn=512 seconds=0.3 |
       python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["large_matmul_gflops"])')

summarize() {  # summarize NAME METRICS_FILE
  python3 - "$1" "$2" "$skip" "$peak" "${baseline:-0}" <<'PY'
import json, statistics, sys
name, path, skip, peak, baseline = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
lines = [json.loads(l) for l in open(path)]
steady = [l for l in lines if l["step"] > skip]
tps = statistics.median(l["tokens_per_second"] for l in steady)
# Defaults of epmoe train: V=512 H=128 F=256 E=16 K=2 L=2, no shared expert.
V, H, F, E, K, L = 512, 128, 256, 16, 2, 2
flops_per_token = 6 * (L * (K * 3 * H * F + H * E) + H * V)
after = statistics.mean(statistics.mean(l["rank_load_max_over_mean_after"]) for l in steady)
before = statistics.mean(statistics.mean(l["rank_load_max_over_mean_before"]) for l in steady)
moved = statistics.median(sum(l["bytes_sent"].values()) for l in steady) / 1e6
ratio = f"{tps / baseline:6.2f}" if baseline > 0 else "     -"
print(f"{name:<34} {tps / 1e3:8.1f}k {ratio}   {tps * flops_per_token / 1e9 / peak:6.3f}   "
      f"{before:5.2f} -> {after:5.2f}   {moved:7.2f}")
if baseline == 0:
    print(tps, file=open(sys.argv[2] + ".tps", "w"))
PY
}

train() {  # train NAME KEY=VALUE...
  local name=$1
  shift
  "$build/epmoe" train steps="$steps" progress=off metrics_file="$out/$name.jsonl" "$@" > /dev/null
  summarize "$name" "$out/$name.jsonl"
}

echo "epmoe train, $steps steps (median over steps > $skip); one large fp32 matmul: $peak GFLOP/s"
printf "%-34s %9s %6s   %6s   %14s   %7s\n" configuration "tok/s" "vs 1" "sgemm" "rank load b->a" "MB/step"
baseline=0
train "ranks=1" ranks=1
baseline=$(cat "$out/ranks=1.jsonl.tps")
train "alltoall" ranks=4
train "alltoall dedup" ranks=4 dedup=true
train "ring" ranks=4 dispatch=ring
train "ring fp8_tokens=tensor" ranks=4 dispatch=ring fp8_tokens=tensor
train "alltoall balance=dynamic B=1" ranks=4 balance=dynamic redundant_slots=1
train "alltoall balance=dynamic B=2" ranks=4 balance=dynamic redundant_slots=2
train "alltoall balance=periodic B=1" ranks=4 balance=periodic redundant_slots=1 balance_period=20 balance_window=20
train "ring balance=dynamic B=1" ranks=4 dispatch=ring balance=dynamic redundant_slots=1
if command -v mpirun > /dev/null; then
  mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4)
  for dispatch in alltoall ring; do
    "${mpi[@]}" "$build/epmoe" train transport=mpi dispatch=$dispatch steps="$steps" progress=off \
      metrics_file="$out/mpi_$dispatch.jsonl" > /dev/null
    summarize "mpirun -np 4 $dispatch" "$out/mpi_$dispatch.jsonl"
  done
fi
