#!/usr/bin/env bash
# The embedding examples (examples/embed) against the installed package:
# installs BUILD_DIR into a clean prefix, configures and builds the examples
# there with find_package(epmoe), runs them, and compares their outputs with
# `epmoe layer` on the inputs they wrote, file for file (same bits): the
# whole-world layer, and the per-rank API (with MPI in the package) under
# mpirun and with ranks as threads, for both dispatchers, dedup, chunks, fp8
# tokens and replicas, R = 1..4. Then
# builds tests/package (the communicator factories, <epmoe/threads_world.h>
# and, when the package has MPI, <epmoe/mpi_communicator.h>) the same way and
# runs it, under mpirun -np 2 when it has MPI.
# Usage: scripts/test_embed.sh [BUILD_DIR]     (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
cmake -S examples/embed -B "$work/example" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" \
  > "$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$work/example" -j 2 > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
"$work/example/embed_layer" "$work/run"
"$work/prefix/bin/epmoe" layer --in "$work/run/inputs" --out "$work/cli" ranks=2 top_k=2 dispatch=alltoall
for name in y topk_ids topk_weights dx dgate dwi0 dwi1 dwo; do
  cmp "$work/run/$name.npy" "$work/cli/$name.npy" || { echo "FAIL: $name.npy differs from epmoe layer's" >&2; exit 1; }
done
echo "PASS: the installed package's example equals epmoe layer bit for bit (8 outputs)"

# The per-rank API: R ranks as processes (mpirun) and as threads, each
# configuration against `epmoe layer ranks=R` on the inputs the run wrote.
same_as_cli() {  # OUT_DIR R KEYS...: every output of OUT_DIR equals epmoe layer's
  local out=$1 ranks=$2
  shift 2
  rm -rf "$work/cli"
  "$work/prefix/bin/epmoe" layer --in "$out/inputs" --out "$work/cli" ranks="$ranks" "$@" > /dev/null
  for name in y topk_ids topk_weights dx dgate dwi0 dwi1 dwo; do
    cmp -s "$out/$name.npy" "$work/cli/$name.npy" || { echo "FAIL: per-rank $name.npy ($out, ranks=$ranks $*) differs from epmoe layer's" >&2; exit 1; }
  done
}
if [ -x "$work/example/embed_per_rank" ]; then
  mpirun_same_as_cli() {  # R KEYS...: the example under mpirun -np R equals epmoe layer
    local ranks=$1
    rm -rf "$work/mpi"
    # Each process computes on the threads `epmoe layer ranks=R` gives a rank
    # (max(1, cores / R)): priced replicas are priced at that budget.
    local threads=$(($(nproc) / ranks > 1 ? $(nproc) / ranks : 1))
    OMP_NUM_THREADS=$threads mpirun --allow-run-as-root --oversubscribe --bind-to none -x OMP_NUM_THREADS -np "$ranks" \
      "$work/example/embed_per_rank" "$work/mpi" "${@:2}"
    same_as_cli "$work/mpi" "$@"
    runs=$((runs + 1))
  }
  configs=(
    "dispatch=alltoall"
    "dispatch=alltoall dedup=true token_chunks=2"
    "dispatch=alltoall fp8_tokens=tensor"
    "dispatch=ring token_chunks=2"
    "dispatch=ring fp8_tokens=token remat_policy=full"
    "dispatch=alltoall dedup=true balance=dynamic redundant_slots=1"
    "dispatch=ring balance=dynamic redundant_slots=2"
  )
  runs=0
  for config in "${configs[@]}"; do
    for ranks in 1 2 3 4; do
      rm -rf "$work/threads"
      # shellcheck disable=SC2086
      "$work/example/embed_per_rank" --threads "$ranks" "$work/threads" $config
      # shellcheck disable=SC2086
      same_as_cli "$work/threads" "$ranks" $config
      runs=$((runs + 1))
    done
    for ranks in 3; do
      # shellcheck disable=SC2086
      mpirun_same_as_cli "$ranks" $config
    done
  done
  for ranks in 2 4; do  # the other process counts, on two configurations
    for config in "dispatch=alltoall dedup=true token_chunks=2" "dispatch=ring balance=dynamic redundant_slots=2"; do
      # shellcheck disable=SC2086
      mpirun_same_as_cli "$ranks" $config
    done
  done
  echo "PASS: the per-rank API (threads R = 1..4, mpirun -np 2, 3, 4) equals epmoe layer bit for bit ($runs runs x 8 outputs)"
fi

cmake -S tests/package -B "$work/package" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" \
  > "$work/package_configure.log" 2>&1 || { cat "$work/package_configure.log"; exit 1; }
cmake --build "$work/package" -j 2 > "$work/package_build.log" 2>&1 || { cat "$work/package_build.log"; exit 1; }
if [ -f "$work/prefix/include/epmoe/mpi_communicator.h" ]; then
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$work/package/communicators"
else
  "$work/package/communicators"
fi
