#!/usr/bin/env bash
# The Python package's tests: `pip install .` into a virtual environment
# (build-python/venv; scikit-build-core and nanobind come from PyPI, the CMake
# build lives in build-python/<wheel tag>/ and reuses ./build's objects
# through ccache), then pytest python/tests. Needs ./build/epmoe (the tests
# compare with the tool).
# torch is Debian's python3-torch, seen by the venv through
# --system-site-packages: a CPU build of ~300 MB, where PyPI's default wheel
# brings ~4 GB of CUDA libraries (PyTorch's CPU-only index is not reachable
# from these machines). chromium renders the HTML report in its test.
# python3-mpi4py (Debian's, on the same OpenMPI as epmoe; it pulls in
# mpirun) for the per-rank layer under mpirun (test_mpi.py) and the training
# example (test_examples.py), seen by the venv the same way.
#   EPMOE_PYTHON_TORCH=0  leave torch out (its tests then skip, saying why)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
packages=(python3-venv python3-dev chromium python3-mpi4py)
if [ "${EPMOE_PYTHON_TORCH:-1}" != 0 ]; then packages+=(python3-torch); fi
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "test_python: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
venv=build-python/venv
if [ ! -x "$venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
# numpy < 2: Debian's torch 1.13 is built against the numpy 1 ABI.
"$venv/bin/pip" install -q pytest matplotlib "numpy<2"
# The module's layer libraries are the Release build's objects, found in
# ccache (CMakeLists.txt): a cache hit needs the same compiler command, so
# the same compiler and generator as ./build (CMake's Makefiles; pip would
# pick Ninja, whose object paths differ).
CXX=$(sed -n 's/^CMAKE_CXX_COMPILER:FILEPATH=//p' build/CMakeCache.txt) \
  CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$venv/bin/pip" install -q .
# epmoe.plan() is compared with `epmoe plan --json`, and the layer with `epmoe layer`.
export PATH="$PWD/build:$PATH"
export EPMOE_BINARY="$PWD/build/epmoe"
"$venv/bin/python" -m pytest -q python/tests
echo "test_python: passed in $(( $(date +%s) - start )) s"
