#!/usr/bin/env bash
# The embedding example (examples/embed) against the installed package:
# installs BUILD_DIR into a clean prefix, configures and builds the example
# there with find_package(epmoe), runs it, and compares its outputs with
# `epmoe layer` on the inputs it wrote, file for file (same bits). Then
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

cmake -S tests/package -B "$work/package" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" \
  > "$work/package_configure.log" 2>&1 || { cat "$work/package_configure.log"; exit 1; }
cmake --build "$work/package" -j 2 > "$work/package_build.log" 2>&1 || { cat "$work/package_build.log"; exit 1; }
if [ -f "$work/prefix/include/epmoe/mpi_communicator.h" ]; then
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$work/package/communicators"
else
  "$work/package/communicators"
fi
