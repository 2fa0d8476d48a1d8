#!/usr/bin/env bash
# Installs whatever is missing (Debian packages only), then configures and
# builds epmoe into ./build (Release, tests and benchmarks included).
# Usage: scripts/setup.sh [BUILD_DIR [extra cmake args...]]
set -euo pipefail
cd "$(dirname "$0")/.."

# Each package and why it is here: README.md, "Dependencies".
packages=(
  g++ cmake make pkg-config
  libdnnl-dev                      # oneDNN: GEMM / grouped GEMM
  libopenmpi-dev openmpi-bin       # MPI transport, mpirun
  libyaml-cpp-dev                  # YAML configs
  nlohmann-json3-dev               # metrics.json, --json outputs
  zlib1g-dev                       # CRC-32 of checkpoint files
  libcli11-dev                     # command line
  libgtest-dev                     # tests
  libbenchmark-dev                 # micro-benchmarks
)
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
cmake --build "$build_dir" -j "$(nproc)"
