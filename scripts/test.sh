#!/usr/bin/env bash
# Installs ltx-kernels (scripts/install.sh) and runs every test: the C++ GoogleTest suite of
# the torch-free core, then the Python suite. CUDA cases run only where a GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
venv=$(cd "${LTX_KERNELS_VENV:-.venv}" && pwd)
export PATH="$venv/bin:$PATH"

echo "== C++ tests (GoogleTest)"
# The CUDA kernels' tests run only on a GPU: without one, build the host code and references
# alone rather than compiling the kernels a second time (the extension above built them).
cuda=OFF
nvidia-smi -L >/dev/null 2>&1 && cuda=AUTO
cmake -S . -B build/cpp -G Ninja -DLTX_KERNELS_TORCH=OFF -DLTX_KERNELS_TESTS=ON -DLTX_KERNELS_CUDA=$cuda \
  > build-cpp.log 2>&1 || { cat build-cpp.log; exit 1; }
cmake --build build/cpp >> build-cpp.log 2>&1 || { tail -50 build-cpp.log; exit 1; }
ctest --test-dir build/cpp --output-on-failure

echo "== Python tests"
# One pytest-xdist worker a core, at most 4 (each imports torch, diffusers and transformers and
# builds its own test models): on CI's 2 cores the suite takes about half its single-process time.
cores=$(nproc)
workers=$((cores < 4 ? cores : 4))
python -m pytest tests/python -q -n "$workers"
