#!/usr/bin/env bash
# Every test: install what is missing, build (Release), run the whole ctest
# suite (unit tests, ranks-as-threads tests, mpirun tests, CLI end to end),
# then the sanitizer variants (ThreadSanitizer for the threads transport and
# collectives, AddressSanitizer + UBSan for every test).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh build
ctest --test-dir build --output-on-failure -j 2 --timeout 900
bash scripts/test_sanitizers.sh
echo "test.sh: everything passed in $(( $(date +%s) - start )) s"
