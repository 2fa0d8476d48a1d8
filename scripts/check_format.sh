#!/usr/bin/env bash
# Checks that C++ files follow .clang-format (Debian's clang-format 14); prints
# each violation and exits non-zero when any file would change.
# Usage: scripts/check_format.sh            every tracked .h/.cc/.cpp file
#        scripts/check_format.sh FILE...    only these files
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format > /dev/null || { echo "check_format: clang-format is not installed (scripts/setup.sh installs it)" >&2; exit 2; }
if (($#)); then
  files=("$@")
else
  mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cpp')
fi
if clang-format --style=file:.clang-format --dry-run -Werror "${files[@]}"; then
  echo "check_format: ${#files[@]} files follow .clang-format"
else
  echo "check_format: files above differ from .clang-format; run: clang-format -i FILE" >&2
  exit 1
fi
