#!/usr/bin/env bash
# The main job: install what is missing, build, then train the tiny MoE
# language model with the defaults of `epmoe train` (500 steps, 4 rank
# threads, Zipf data). Metrics land in runs/train/metrics.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --target epmoe build
./build/epmoe train "$@"
