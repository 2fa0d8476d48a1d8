#!/usr/bin/env bash
# epmoe's single-rank MoE layer vs the same layer in PyTorch (CPU), same
# shapes and thread count, run back to back; prints both and the ratio.
# Installs Debian's python3-torch if it is missing (bench only, not tests),
# and OpenBLAS (OpenMP build) for it: Debian's torch is built against the
# generic libblas.so.3, which without OpenBLAS resolves to the reference
# BLAS (~4 GFLOP/s here) - a crippled peer. With OpenBLAS its sgemm runs at
# ~95 GFLOP/s on this machine.
#   bench/peers/compare_layer_with_torch.sh [BUILD_DIR] [key=value ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${1:-build}
shift || true
missing=()
/usr/bin/python3 -c "import torch" 2>/dev/null || missing+=(python3-torch)
dpkg-query -W -f='${Status}' libopenblas0-openmp 2>/dev/null | grep -q "install ok installed" || missing+=(libopenblas0-openmp)
if ((${#missing[@]})); then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
threads=$(nproc)
for dtype in f32 bf16; do
  ours=$("$build_dir/bench/bench_moe_layer" json=true compute_dtype=$dtype threads=$threads "$@")
  # PyTorch's BLAS gets its own best settings: OpenBLAS detects the core type
  # itself (this machine's environment pins OPENBLAS_CORETYPE=Haswell for
  # other programs; it is unset for this command alone).
  theirs=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=$threads \
           /usr/bin/python3 bench/peers/torch_moe_layer.py compute_dtype=$dtype threads=$threads "$@")
  /usr/bin/python3 - "$ours" "$theirs" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{ours['compute_dtype']:5s} N={ours['tokens']} H={ours['hidden']} F={ours['ffn']} E={ours['experts']} "
      f"K={ours['top_k']} threads={ours['threads']}: epmoe {ours['fwd_bwd_seconds']*1e3:.2f} ms "
      f"({ours['gflops']:.0f} GFLOP/s, {ours['gflops']/ours['large_matmul_gflops']:.2f} of one large matmul), "
      f"{theirs['impl']} {theirs['fwd_bwd_seconds']*1e3:.2f} ms ({theirs['gflops']:.0f} GFLOP/s); "
      f"speed-up x{theirs['fwd_bwd_seconds']/ours['fwd_bwd_seconds']:.2f}")
PY
done
