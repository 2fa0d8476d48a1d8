#!/usr/bin/env bash
# epmoe's single-rank MoE layer vs the same layer in PyTorch (CPU), same
# shapes and thread count, run back to back; prints each peer and the ratio.
# Peers, each a row when present:
#  * the newest PyTorch from PyPI in a virtualenv ($TORCH_VENV, default
#    /tmp/torch-venv; never committed), e.g.
#      python3 -m venv /tmp/torch-venv && /tmp/torch-venv/bin/pip install torch numpy
#    (PyTorch's own CPU-only index may be unreachable; the PyPI wheel runs on
#    the CPU as well). Its BLAS is the MKL it bundles.
#  * Debian's python3-torch, installed if missing when there is no venv
#    peer (bench only, not tests), with OpenBLAS (OpenMP build): Debian's
#    torch is built against the generic libblas.so.3, which without OpenBLAS
#    resolves to the reference BLAS (~4 GFLOP/s here) - a crippled peer.
# A compute_dtype this CPU cannot run in epmoe (bf16 without oneDNN bf16
# matmul) is reported and skipped.
#   [TORCH_VENV=DIR] [THREADS=N] bench/peers/compare_layer_with_torch.sh [BUILD_DIR] [key=value ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${1:-build}
shift || true
venv=${TORCH_VENV:-/tmp/torch-venv}
peers=()
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import torch" 2>/dev/null; then
  peers+=("$venv/bin/python")
fi
if ((${#peers[@]} == 0)); then
  missing=()
  /usr/bin/python3 -c "import torch" 2>/dev/null || missing+=(python3-torch)
  dpkg-query -W -f='${Status}' libopenblas0-openmp 2>/dev/null | grep -q "install ok installed" || missing+=(libopenblas0-openmp)
  if ((${#missing[@]})); then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  fi
fi
/usr/bin/python3 -c "import torch" 2>/dev/null && peers+=(/usr/bin/python3)
threads=${THREADS:-$(nproc)}
for dtype in f32 bf16; do
  if ! ours=$("$build_dir/bench/bench_moe_layer" json=true compute_dtype=$dtype threads=$threads "$@"); then
    echo "$dtype: epmoe cannot run it on this CPU; skipped"
    continue
  fi
  for python in "${peers[@]}"; do
    # PyTorch's BLAS gets its own best settings: OpenBLAS detects the core
    # type itself (this machine's environment pins OPENBLAS_CORETYPE=Haswell
    # for other programs; it is unset for this command alone); the thread
    # count through OMP_NUM_THREADS and torch.set_num_threads; glibc malloc
    # keeps freed blocks up to 32 MiB instead of returning them to the
    # kernel, since a fresh page costs ~11 us here (DESIGN.md §7) and
    # PyTorch's CPU allocator frees every step's tensors (measured: 6.9 s ->
    # 4.3 s per step for the PyPI torch at 2 threads on a busy machine).
    theirs=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=$threads \
             GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184:glibc.malloc.top_pad=268435456 \
             "$python" bench/peers/torch_moe_layer.py compute_dtype=$dtype threads=$threads "$@")
    /usr/bin/python3 - "$ours" "$theirs" "$python" <<'PY'
import json, sys
ours, theirs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
peak = ours.get("fma_peak_gflops", 0)
print(f"{ours['compute_dtype']:5s} N={ours['tokens']} H={ours['hidden']} F={ours['ffn']} E={ours['experts']} "
      f"K={ours['top_k']} threads={ours['threads']}: epmoe {ours['fwd_bwd_seconds']*1e3:.2f} ms "
      f"({ours['gflops']:.0f} GFLOP/s, {ours['gflops']/ours['large_matmul_gflops']:.2f} of one large matmul"
      + (f", {ours['gflops']/peak:.2f} of the FMA peak {peak:.0f}" if peak else "")
      + (f", {ours['gflops']/ours['bound_gflops']:.2f} of the one-expert bound"
         f" ({ours['best_gflops']/ours['best_bound_gflops']:.2f} fastest repetitions)" if "bound_gflops" in ours else "")
      + "), "
      f"{theirs['impl']} ({sys.argv[3]}) {theirs['fwd_bwd_seconds']*1e3:.2f} ms ({theirs['gflops']:.0f} GFLOP/s); "
      f"speed-up x{theirs['fwd_bwd_seconds']/ours['fwd_bwd_seconds']:.2f}")
uses = ours.get("implementations", [])
if uses:
    print("      epmoe's products by oneDNN implementation: " + ", ".join(
        f"{u['implementation']} ({u['compute_dtype']}) {100 * u['flop_share']:.1f}%" for u in uses))
PY
  done
done
