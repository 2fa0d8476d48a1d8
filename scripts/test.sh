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
# Each part's time is printed so a slow part shows in CI's log (the whole
# command must stay well under CI's budget).
part() {
  local t0
  t0=$(date +%s)
  "$@"
  echo "test.sh: '$*' took $(( $(date +%s) - t0 )) s"
}
part bash scripts/setup.sh build
part bash scripts/check_format.sh
part ctest --test-dir build --output-on-failure -j 2 --timeout 900
part bash scripts/test_embed.sh build
part bash scripts/test_sanitizers.sh
part bash scripts/test_python.sh
echo "test.sh: everything passed in $(( $(date +%s) - start )) s"
