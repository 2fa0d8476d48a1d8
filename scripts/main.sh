#!/usr/bin/env bash
# The main job: install what is missing, build, then run one MoE layer
# forward + backward on generated inputs (the trainer replaces this once it
# exists). Outputs land in build/demo/out.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
demo=build/demo
rm -rf "$demo"
./build/epmoe gen-inputs --out "$demo/in" num_tokens=4096 hidden=512 ffn=256 num_experts=16 seed=1
./build/epmoe layer --in "$demo/in" --out "$demo/out" top_k=2 router=softmax_topk
echo "main: outputs in $demo/out:"
ls "$demo/out"
