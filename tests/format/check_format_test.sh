#!/usr/bin/env bash
# The formatting check must fail on a misformatted file and pass on the same
# file once clang-format has formatted it (so a check that passes everything
# cannot go unnoticed). The file sits inside the tree so that it is checked
# against the tree's .clang-format.
set -euo pipefail
cd "$(dirname "$0")/../.."
probe=tests/format/.probe_$$.cc
trap 'rm -f "$probe"' EXIT
printf 'int   add( int a,int b ){return a+b;}\n' > "$probe"
if bash scripts/check_format.sh "$probe" > /dev/null 2>&1; then
  echo "FAIL: check_format.sh accepted a misformatted file" >&2
  exit 1
fi
clang-format --style=file:.clang-format -i "$probe"
bash scripts/check_format.sh "$probe"
echo "PASS: a misformatted file fails the check and passes once formatted"
