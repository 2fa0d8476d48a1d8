#!/usr/bin/env bash
# The Python package's tests: a virtual environment in build-python/venv,
# `pip install .` (scikit-build-core and nanobind come from PyPI; the CMake
# build lives in build-python/<wheel tag>/ and reuses ccache), numpy, pytest
# and torch, then pytest python/tests.
#   EPMOE_PYTHON_TORCH=0  skip installing torch (PyPI's wheel, ~4 GB with its
#                         CUDA libraries, which import fine on a CPU-only
#                         machine); the torch-in/torch-out tests then skip,
#                         saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build-python/venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q numpy pytest
if [ "${EPMOE_PYTHON_TORCH:-1}" != 0 ]; then
  "$venv/bin/pip" install -q torch
fi
"$venv/bin/pip" install -q .
# epmoe.plan() is compared with `epmoe plan --json` when a built tool is found.
if [ -x build/epmoe ]; then
  export PATH="$PWD/build:$PATH"
fi
"$venv/bin/python" -m pytest -q python/tests
