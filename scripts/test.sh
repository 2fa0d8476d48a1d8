#!/usr/bin/env bash
# Every test: install what is missing, build (Release), run the whole ctest
# suite (unit tests, ranks-as-threads tests, mpirun tests, CLI end to end).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
ctest --test-dir build --output-on-failure -j 2 --timeout 900
