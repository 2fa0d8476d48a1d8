#!/usr/bin/env bash
# Prints one line per `epmoe layer` and `epmoe train` configuration: the configuration and the
# sha256 of every output array (y, dx, dgate, dwi0, dwi1, dwo, topk_*), so
# that two builds can be compared bit for bit:
#   bash scripts/runtime_bits.sh build-old > old.txt
#   bash scripts/runtime_bits.sh build > new.txt && diff old.txt new.txt
# (a refactor of the runtime must leave every line unchanged; the arrays
# depend on the machine's ISA through oneDNN, so compare on one machine).
set -euo pipefail
build=${1:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$build/epmoe" gen-inputs --out "$work/in" num_tokens=61 hidden=24 ffn=20 num_experts=12 seed=3 > /dev/null
configs=(
  "dispatch=alltoall"
  "dispatch=alltoall dedup=true"
  "dispatch=alltoall token_chunks=3"
  "dispatch=alltoall dedup=true token_chunks=2 remat_policy=full"
  "dispatch=alltoall fp8_tokens=tensor"
  "dispatch=alltoall fp8_tokens=token dedup=true remat_policy=save_dispatch"
  "dispatch=alltoall capacity_factor=1.0"
  "dispatch=alltoall balance=dynamic redundant_slots=2"
  "dispatch=alltoall balance=dynamic redundant_slots=1 dedup=true token_chunks=2"
  "dispatch=ring"
  "dispatch=ring token_chunks=2"
  "dispatch=ring fp8_tokens=tensor remat_policy=full"
  "dispatch=ring cotangent_all_gather=plain token_chunks=3"
  "dispatch=ring balance=dynamic redundant_slots=2"
)
for ranks in 1 2 3 4; do
  for config in "${configs[@]}"; do
    out="$work/out"
    rm -rf "$out"
    # shellcheck disable=SC2086
    "$build/epmoe" layer --in "$work/in" --out "$out" ranks=$ranks $config > /dev/null
    sums=$(cd "$out" && sha256sum ./*.npy | cut -c1-16 | tr '\n' ' ')
    echo "ranks=$ranks $config: $sums"
  done
done
# Training: the sha256 of every step's (loss, grad_norm) bits.
train_configs=(
  ""
  "dispatch=ring"
  "dedup=true token_chunks=2"
  "balance=dynamic redundant_slots=1"
  "shared_expert_ffn=32 fp8_tokens=token"
  "router=random aux_loss_coef=0"
)
for ranks in 1 2 4; do
  for config in "${train_configs[@]}"; do
    # shellcheck disable=SC2086
    "$build/epmoe" train steps=12 ranks=$ranks progress=off metrics_file="$work/m.jsonl" $config > /dev/null
    sum=$(python3 -c 'import json,sys; print(*[(l["loss"].hex(), l["grad_norm"].hex()) for l in map(json.loads, open(sys.argv[1]))])' "$work/m.jsonl" | sha256sum | cut -c1-16)
    echo "train ranks=$ranks $config: $sum"
  done
done
