#!/usr/bin/env bash
# Sanitizer variants of the test suite:
#   build-tsan/  ThreadSanitizer: the threads transport and the collectives on
#                it (MPI left out: OpenMPI's own threads are not instrumented;
#                the layers above use OpenMP, whose runtime is not either).
#   build-asan/  AddressSanitizer + UBSan: every test of every layer,
#                the mpirun tests included.
# Usage: scripts/test_sanitizers.sh [jobs]      (default: 2)
# It prints a "took" line: 781 s for the full ASan build with -O2 -g while
# another build shared the 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${1:-2}
start=$(date +%s)

# Only the layers these tests need (core, transport, comm); core's own tests
# are left out, so ctest lists exactly the transport/comm tests.
skip_layers="kernels;moe;ep;balance;data;model;plan;cli"
configure() {  # configure BUILD_DIR SANITIZER EXTRA...
  local dir=$1 sanitizer=$2
  shift 2
  # -O1 -g1: line tables for the sanitizers' stack traces at a fraction of
  # full debug info's compile time (the ASan build of every test is most of
  # this script's time).
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DEPMOE_BUILD_BENCH=OFF \
    -DEPMOE_SANITIZE="$sanitizer" -DEPMOE_SKIP_LAYERS="$skip_layers" -DEPMOE_SKIP_TESTS=core \
    "$@" > "$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; exit 1; }
}

mkdir -p build-tsan build-asan
configure build-tsan thread -DEPMOE_WITH_MPI=OFF
cmake --build build-tsan -j "$jobs" --target transport_threads_test comm_threads_test
# halt_on_error: a race fails the test instead of only printing a report.
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  ctest --test-dir build-tsan --no-tests=error --output-on-failure -j "$jobs"

configure build-asan address -DEPMOE_WITH_MPI=ON -DEPMOE_SKIP_LAYERS= -DEPMOE_SKIP_TESTS=
cmake --build build-asan -j "$jobs"
# OpenMPI keeps allocations until exit by design; leak checking stays on for
# the threads tests and off under mpirun.
UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1" \
  ctest --test-dir build-asan --no-tests=error --output-on-failure -j "$jobs" -LE mpi
ASAN_OPTIONS="detect_leaks=0" UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1" \
  ctest --test-dir build-asan --no-tests=error --output-on-failure -L mpi

echo "test_sanitizers: took $(( $(date +%s) - start )) s"
