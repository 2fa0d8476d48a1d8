#!/usr/bin/env bash
# Installs the epmoe Python package (and what `python -m epmoe.report` needs:
# numpy, matplotlib) into the project's virtual environment build-python/venv,
# for the main command's report (scripts/main.sh) and the Python tests
# (scripts/test_python.sh, which adds its own packages to the same venv).
# Needs ./build configured by scripts/setup.sh: the module's layer libraries
# are that build's objects, found in ccache.
# python3-venv and python3-dev (the module's headers) come with the image;
# scikit-build-core, nanobind, numpy and matplotlib come from PyPI. No torch:
# neither `import epmoe` nor the report imports it.
# Usage: scripts/install_python.sh [--deps-only | --module-only]
#   --deps-only    only the venv and its PyPI packages (no build needed: the
#                  main command runs this part beside the C++ build, since
#                  it mostly waits for downloads)
#   --module-only  only the epmoe module (the venv must exist)
set -euo pipefail
cd "$(dirname "$0")/.."
phase=${1:-all}
case $phase in
  all | --deps-only | --module-only) ;;
  *) echo "install_python: unknown argument '$phase' (expected --deps-only or --module-only)" >&2; exit 2 ;;
esac
venv=build-python/venv
if [ "$phase" = --module-only ] && [ ! -x "$venv/bin/python" ]; then
  echo "install_python: --module-only needs $venv (run with --deps-only first)" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  # --system-site-packages: the tests see Debian's torch and mpi4py.
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
# numpy < 2: Debian's torch 1.13 is built against the numpy 1 ABI. The
# build requirements (scikit-build-core, nanobind) live in the venv and the
# build is not isolated: pip's isolated build environment is a new
# /tmp/pip-build-env-* every time, so nanobind's 11 sources had a new path
# and were compiled again (ccache misses) by every install.
mapfile -t requires < <("$venv/bin/python" -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
if [ "$phase" != --module-only ]; then
  "$venv/bin/pip" install -q matplotlib "numpy<2" "${requires[@]}"
fi
[ "$phase" = --deps-only ] && exit 0
# The module's layer libraries are the Release build's objects, found in
# ccache (CMakeLists.txt): a cache hit needs the same compiler command, so
# the same compiler and generator as ./build (CMake's Makefiles; pip would
# pick Ninja, whose object paths differ). In a build directory of its own:
# after a plain `pip install .` (Ninja) in pyproject's build-python-*, a
# Makefiles build there has no dependency records for Ninja's objects and
# kept a stale module while the sources had changed.
CXX=$(sed -n 's/^CMAKE_CXX_COMPILER:FILEPATH=//p' build/CMakeCache.txt) \
  CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$venv/bin/pip" install -q --no-build-isolation --config-settings=build-dir="build-python-make-{wheel_tag}" .
