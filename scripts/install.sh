#!/usr/bin/env bash
# Installs ltx-kernels from this checkout into a virtual environment, building the C++/CUDA
# extension against the torch installed there.
#   bash scripts/install.sh            # venv at .venv (created if missing)
#   LTX_KERNELS_VENV=/path/to/venv bash scripts/install.sh
#   TORCH_SPEC="torch==2.12.0" ...     # another torch (default: the tested 2.11.0)
# The CUDA kernels are built when nvcc is found (CUDA 12.x/13.x); otherwise CPU only.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${LTX_KERNELS_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
# Always asked for, so an environment with another torch is brought to the pinned one (a
# no-op when it is already there).
"$py" -m pip install -q "${TORCH_SPEC:-torch==2.11.0}"
# diffusers: tests compare the DiT ops and the integration with its own LTX-Video code;
# accelerate: the CPU-offload hooks the integration must work under; transformers: the LLM
# integration and diffusers' pipelines; kernels: the HF Kernels Hub route. transformers only
# uses `kernels` within a version window of its own (5.17: kernels >= 0.16, < 0.17). peft and
# torchao: LoRA adapters and a quantized base model under inject (test_diffusers_compose.py).
# nvidia-cutlass: the CUTLASS/CuTe headers the Hopper (sm_90a) kernels are built with.
# hypothesis: the property-based (fuzz) tests; pytest-xdist: test.sh's worker processes.
"$py" -m pip install -q numpy pytest pytest-xdist hypothesis "diffusers==0.42.1" accelerate "transformers==5.17.0" "kernels==0.16.2" \
  "peft==0.21.2" "torchao==0.18.0" "scikit-build-core>=0.10" "cmake>=3.24" ninja "nvidia-cutlass==4.2.0.0"
# --no-build-isolation: build against the torch above, not a fresh copy in an isolated env.
"$py" -m pip install -q --no-build-isolation .
"$py" -c "import ltx_kernels, torch; print('ltx_kernels', ltx_kernels.__version__, 'on torch', torch.__version__, '(CUDA available:', torch.cuda.is_available(), ')')"
