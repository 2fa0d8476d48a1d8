#!/usr/bin/env bash
# The main job: install what is missing, build, train the tiny MoE language
# model with the defaults of `epmoe train` (500 steps, 4 rank threads, Zipf
# data; key=value arguments are passed on to it), then draw the run's
# pictures. Metrics land in runs/train/metrics.jsonl, the pictures in
# runs/train/report.html (beside the metrics file when metrics_file= moves it).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Python packages of the report (numpy, matplotlib, the module's build
# requirements) download beside the C++ build: that part mostly waits for
# the network, the build for the CPU.
mkdir -p build-python
bash scripts/install_python.sh --deps-only > build-python/deps.log 2>&1 &
deps=$!
summary=$(mktemp)
# A failed build leaves no download running behind it.
trap 'kill "$deps" 2>/dev/null || true; rm -f "$summary"' EXIT
bash scripts/setup.sh --target epmoe build
if ! wait "$deps"; then
  cat build-python/deps.log
  echo "main: installing the report's Python packages failed (above; log in build-python/deps.log)" >&2
  exit 1
fi
bash scripts/install_python.sh --module-only
./build/epmoe train "$@" | tee "$summary"
# The report's command is the one `epmoe train` prints (its last line,
# "  report: python -m epmoe.report METRICS [--trace TRACE] --out REPORT"),
# so the paths are the tool's, whatever the arguments and YAML said.
line=$(sed -n 's/^  report: python -m epmoe\.report //p' "$summary")
if [[ $line =~ ^(.+)\ --trace\ (.+)\ --out\ (.+)$ ]]; then
  report_arguments=("${BASH_REMATCH[1]}" --trace "${BASH_REMATCH[2]}" --out "${BASH_REMATCH[3]}")
elif [[ $line =~ ^(.+)\ --out\ (.+)$ ]]; then
  report_arguments=("${BASH_REMATCH[1]}" --out "${BASH_REMATCH[2]}")
else
  echo "main: epmoe train printed no report command (no metrics_file), so there is no report to draw"
  exit 0
fi
build-python/venv/bin/python -m epmoe.report "${report_arguments[@]}"
echo "main: the run's report is $(realpath "${report_arguments[-1]}"): open it in a browser"
