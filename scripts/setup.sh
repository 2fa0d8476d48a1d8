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

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
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
