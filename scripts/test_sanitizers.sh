#!/usr/bin/env bash
# Sanitizer variants of the test suite:
#   build-tsan/  ThreadSanitizer: the threads transport, the collectives on
#                it, and the ep/ and moe/ layers (dispatchers, replicas, the
#                MoE layer with ranks as threads). MPI left out: OpenMPI's own
#                threads are not instrumented. libgomp (OpenMP, under our
#                parallel_for and oneDNN) is not instrumented either, so its
#                barriers are invisible to TSan; nor is oneDNN.
#                scripts/tsan_suppressions.txt silences the false reports
#                that follow from that, each entry explained.
#   build-asan/  AddressSanitizer + UBSan: every test of every layer,
#                the mpirun tests included.
# Usage: scripts/test_sanitizers.sh [jobs]      (default: 2)
# It prints a "took" line per sanitizer. Measured 2026-12-02 (AMD EPYC,
# 2 cores, cold build directories, a fresh clone's test command): TSan part
# 170 s, ASan part 413 s (docs/BENCHMARKS.md, "The test command's own time").
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${1:-2}
start=$(date +%s)

configure() {  # configure BUILD_DIR SANITIZER SKIP_LAYERS SKIP_TESTS EXTRA...
  local dir=$1 sanitizer=$2 skip_layers=$3 skip_tests=$4
  shift 4
  # Unity batches (CMakeLists.txt, EPMOE_UNITY_BUILD): each batch of 16
  # files parses the heavy headers once.
  # -Og -g1: line tables for the sanitizers' stack traces at a fraction of
  # full debug info's compile time; -Og rather than -O1 halves the ASan
  # build (365 s -> 180 s with unity batches, 2026-12-02) for 14% more test
  # time (130 s -> 148 s): the build of every test is most of this script's
  # time.
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-Og -g1" \
    -DEPMOE_BUILD_BENCH=OFF -DEPMOE_UNITY_BUILD=ON \
    -DEPMOE_SANITIZE="$sanitizer" -DEPMOE_SKIP_LAYERS="$skip_layers" -DEPMOE_SKIP_TESTS="$skip_tests" \
    "$@" > "$dir.configure.log" 2>&1 \
    || { cat "$dir.configure.log"; exit 1; }
}

mkdir -p build-tsan build-asan
# TSan: the layers up to moe (data, model, plan, run, cli have no threads of
# their own beyond these). Test folders without a TSan run are left out so
# that ctest lists exactly the tests built here (core, hardware, kernels and
# balance are single-threaded code under parallel_for, or none, covered by
# ASan).
tsan_start=$(date +%s)
configure build-tsan thread "data;model;plan;run;cli" "core;hardware;kernels;balance" -DEPMOE_WITH_MPI=OFF
cmake --build build-tsan -j "$jobs" --target transport_threads_test transport_progress_slot_test \
  transport_rank_threads_test transport_public_threads_world_test comm_threads_test \
  comm_cooperative_progress_test comm_modelled_time_test ep_test moe_test
# halt_on_error: a race fails the test instead of only printing a report.
# OMP_NUM_THREADS is not set: ranks as threads get cores / ranks compute
# threads each (1 on 2 cores, so their parallel_for runs inline), while the
# single-rank and R=1 tests run 2-thread OpenMP teams, so libgomp's team
# hand-offs are exercised (and its suppression is needed: without it 30 of
# the 216 tests fail on reports with libgomp frames).
# Left out under TSan (5-15x slower there), each still run in Release and ASan:
#  * GradientCheck: ~2,000 single-rank forward+backward passes of a 5-token
#    layer (5.6 s in Release), no ranks-as-threads; its threading is
#    parallel_for, the same as in the moe tests that stay;
#  * Bf16Compute: the same single-rank layer with bf16 GEMM operands, whose
#    oneDNN primitives exist only on AVX-512 machines (it fails on AVX2-only
#    CPUs in every build, which is not a race).
#  * ShapeSweep (tests/ep/shape_sweep_test.cc): 15 layer runs with 2 OpenMP
#    compute threads inside each rank thread, 1.2 s in Release; under TSan
#    it does not finish in 240 s. Diagnosed 2026-12-02 with gdb on the
#    running test: the rank threads' OpenMP workers sit in TSan's
#    ReportRace/HandleRacyAddress for every element experts_backward's
#    parallel_for reads (moe/local_experts.cc), each read "racing" with the
#    rank thread's writes before the region through a libgomp hand-off TSan
#    cannot see; every such report is then matched against the libgomp
#    suppression and dropped. A report per address of a 2-thread region is
#    the cost, not a hang. The 2-thread regions of the other moe tests are
#    small enough to finish. ASan and Release run it.
# Measured 2026-12-02 (AMD EPYC, 2 cores): cold TSan build (unity batches,
# -Og) 65 s, then the 345 TSan tests 80-91 s.
tsan_exclude='^moe_test\.(GradientCheck|Bf16Compute)\.|^ep_test\.ShapeSweep\.'
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/scripts/tsan_suppressions.txt" \
  ctest --test-dir build-tsan --no-tests=error --output-on-failure -j "$jobs" -E "$tsan_exclude"
echo "test_sanitizers: TSan part took $(( $(date +%s) - tsan_start )) s"

configure build-asan address "" "" -DEPMOE_WITH_MPI=ON
cmake --build build-asan -j "$jobs"
# OpenMPI keeps allocations until exit by design; leak checking stays on for
# the threads tests and off under mpirun.
# GradientCheck is left out here too (33 s of the ASan run, 2026-12-03):
# ~2,000 forward+backward passes of one 5-token single-rank layer through
# the code paths the moe tests that stay run under ASan, and it runs in
# Release.
UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1" \
  ctest --test-dir build-asan --no-tests=error --output-on-failure -j "$jobs" -LE mpi -E '^moe_test\.GradientCheck\.'
ASAN_OPTIONS="detect_leaks=0" UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1" \
  ctest --test-dir build-asan --no-tests=error --output-on-failure -L mpi

echo "test_sanitizers: took $(( $(date +%s) - start )) s"
