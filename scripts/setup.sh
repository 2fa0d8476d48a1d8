#!/usr/bin/env bash
# Installs whatever is missing (Debian packages only), then configures and
# builds epmoe into ./build (Release).
# Usage: scripts/setup.sh --packages                 print the package list, one a line
#        scripts/setup.sh [--target T] [BUILD_DIR [extra cmake args...]]
#          --target T  build only target T and what it needs (scripts/main.sh
#                      builds `epmoe` alone); default: everything, tests and
#                      benchmarks included
set -euo pipefail
cd "$(dirname "$0")/.."

# Each package and why it is here: README.md, "Dependencies". A package
# that another one only *recommends* is not installed with
# --no-install-recommends, so such gaps are named here explicitly (found by
# configuring and building on a machine with only the image's packages).
packages=(
  g++ cmake make pkg-config
  libdnnl-dev                      # oneDNN: GEMM / grouped GEMM
  ocl-icd-opencl-dev               # oneDNN's CMake config requires OpenCL (libdnnl-dev only recommends it)
  libopenmpi-dev openmpi-bin       # MPI transport, mpirun
  libyaml-cpp-dev                  # YAML configs
  nlohmann-json3-dev               # metrics.json, --json outputs
  zlib1g-dev                       # CRC-32 of checkpoint files
  libcli11-dev                     # command line
  libgtest-dev                     # tests
  libbenchmark-dev                 # micro-benchmarks
  ccache                           # the Python package's build reuses the Release build's objects (scripts/test_python.sh)
  clang-format                     # the formatting check of the test command (scripts/check_format.sh)
  libopenblas-dev libopenblas0-openmp  # opt-in f32 GEMM backend EPMOE_F32_GEMM=openblas (and its tests)
)
if [ "${1:-}" = "--packages" ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi
target=
if [ "${1:-}" = "--target" ]; then
  [ -n "${2:-}" ] || { echo "setup: --target needs a target name" >&2; exit 2; }
  target=$2
  shift 2
fi

if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# EPMOE_GEMM_CANDIDATES=1: also install the f32 GEMM libraries that
# bench/gemm_libraries.cc compares with oneDNN (issue 29; README,
# "Dependencies"): Debian's libxsmm-dev, and Intel MKL from PyPI into
# build-deps/mkl, where CMake finds it (cmake/mkl.cmake). Not by default:
# on the AVX2 EPYC none of them beat oneDNN 2.6 clearly on the layer's
# shapes (docs/BENCHMARKS.md, issue 29), and MKL is a 230 MB download.
# Only the MKL libraries a C++ caller of sgemm needs: the LP64 interface,
# the GNU OpenMP threading layer (epmoe's threads are OpenMP), the core and
# the per-ISA kernels the core loads at run time (def, mc3, avx2, avx512,
# avx10); not the wheel's VML, ScaLAPACK or TBB layers. Pinned, so that
# every machine measures the same kernels.
mkl_version=2026.2.1
mkl_dir=build-deps/mkl
install_mkl() {
  [ -f "$mkl_dir/.installed-$mkl_version" ] && return 0
  local download
  download=$(mktemp -d)
  /usr/bin/python3 -m pip download -q --no-deps --only-binary :all: -d "$download" \
    "mkl==$mkl_version" "mkl-include==$mkl_version"
  # The wheels are zip files: taken apart with Python's zipfile (no unzip on a fresh Debian).
  /usr/bin/python3 - "$download" "$mkl_dir" "$mkl_version" <<'PYTHON'
import glob, os, shutil, sys, zipfile
download, root, version = sys.argv[1:]
shutil.rmtree(root, ignore_errors=True)
os.makedirs(f"{root}/lib"), os.makedirs(f"{root}/include")
with zipfile.ZipFile(glob.glob(f"{download}/mkl-{version}-*.whl")[0]) as wheel:
    for name in ("core", "intel_lp64", "gnu_thread", "def", "mc3", "avx2", "avx512", "avx10"):
        with wheel.open(f"mkl-{version}.data/data/lib/libmkl_{name}.so.3") as src, \
             open(f"{root}/lib/libmkl_{name}.so.3", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    for name in ("core", "intel_lp64", "gnu_thread"):
        os.symlink(f"libmkl_{name}.so.3", f"{root}/lib/libmkl_{name}.so")
with zipfile.ZipFile(glob.glob(f"{download}/mkl_include-{version}-*.whl")[0]) as wheel:
    prefix = f"mkl_include-{version}.data/data/include/"
    for member in wheel.namelist():
        if member.startswith(prefix) and "/" not in member[len(prefix):]:
            with wheel.open(member) as src, open(f"{root}/include/{member[len(prefix):]}", "wb") as dst:
                shutil.copyfileobj(src, dst)
PYTHON
  rm -rf "$download"
  touch "$mkl_dir/.installed-$mkl_version"
}
if [ "${EPMOE_GEMM_CANDIDATES:-0}" = 1 ]; then
  install_mkl
  dpkg-query -W -f='${Status}' libxsmm-dev 2>/dev/null | grep -q "install ok installed" \
    || DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends libxsmm-dev
fi

build_dir=${1:-build}
shift || true
mkdir -p "$build_dir"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@" > "$build_dir/configure.log" 2>&1 \
  || { cat "$build_dir/configure.log"; exit 1; }
if [ -n "$target" ]; then
  cmake --build "$build_dir" -j "$(nproc)" --target "$target"
else
  cmake --build "$build_dir" -j "$(nproc)"
fi
