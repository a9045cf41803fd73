#!/usr/bin/env bash
# Installs ltx-kernels (scripts/install.sh) and runs every test: the C++ GoogleTest suite of
# the torch-free core, then the Python suite. CUDA cases run only where a GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
venv=$(cd "${LTX_KERNELS_VENV:-.venv}" && pwd)
export PATH="$venv/bin:$PATH"

echo "== C++ tests (GoogleTest)"
cmake -S . -B build/cpp -G Ninja -DLTX_KERNELS_TORCH=OFF -DLTX_KERNELS_TESTS=ON > build-cpp.log 2>&1 \
  || { cat build-cpp.log; exit 1; }
cmake --build build/cpp >> build-cpp.log 2>&1 || { tail -50 build-cpp.log; exit 1; }
ctest --test-dir build/cpp --output-on-failure

echo "== Python tests"
python -m pytest tests/python -q
