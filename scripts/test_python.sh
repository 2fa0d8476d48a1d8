#!/usr/bin/env bash
# The Python package's tests: the main command, short (scripts/main.sh: it
# installs the package into build-python/venv with scripts/install_python.sh
# and draws its run's report, which test_report.py renders with Chromium),
# then pytest python/tests (which compare with the tool, ./build/epmoe).
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
# 12 steps of the main job's model, metrics in a directory of their own.
main_run=build-python/main-run
rm -rf "$main_run"
bash scripts/main.sh steps=12 metrics_file="$main_run/metrics.jsonl"
export EPMOE_MAIN_RUN="$PWD/$main_run"
venv=build-python/venv
"$venv/bin/pip" install -q pytest
# epmoe.plan() is compared with `epmoe plan --json`, and the layer with `epmoe layer`.
export PATH="$PWD/build:$PATH"
export EPMOE_BINARY="$PWD/build/epmoe"
"$venv/bin/python" -m pytest -q python/tests
echo "test_python: passed in $(( $(date +%s) - start )) s"
