#!/usr/bin/env bash
# Every test: install what is missing, build (Release), run the whole ctest
# suite (unit tests, ranks-as-threads tests, mpirun tests, CLI end to end,
# the formatting check), the embedding example against the installed
# package, the sanitizer variants (ThreadSanitizer for the threads transport
# and collectives, AddressSanitizer + UBSan for every test), then the Python
# package's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh build
bash scripts/check_format.sh
ctest --test-dir build --output-on-failure -j 2 --timeout 900
bash scripts/test_embed.sh build
bash scripts/test_sanitizers.sh
bash scripts/test_python.sh
echo "test.sh: everything passed in $(( $(date +%s) - start )) s"
