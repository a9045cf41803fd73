#!/usr/bin/env bash
# Build, test and benchmark on a machine with a GPU, in one go; prints a short table last.
#   bash scripts/gpu_check.sh [OUT_DIR]
# GPU_CHECK_STAGES picks stages after the build (default "cpp py bench"), for machines whose
# time per command is limited (stages: cpp sanitize py py1 py2 bench heldout gemm attention e2e fidelity flux dit wan ltx2 unet cache llm); GPU_CHECK_PYTEST passes extra
# pytest arguments (e.g. -k rope), GPU_CHECK_FILES the test files of the py stages, GPU_CHECK_CTEST a ctest -R regex (e.g. Attention), GPU_CHECK_E2E / GPU_CHECK_FIDELITY / GPU_CHECK_DIT / GPU_CHECK_WAN / GPU_CHECK_LTX2 / GPU_CHECK_UNET / GPU_CHECK_CACHE / GPU_CHECK_LLM extra arguments of the LTX-Video
# (one step), fidelity, image DiT (PixArt, DiT, SD3), Wan, LTX-2, UNet (SDXL, SD 1.5), LTX-Video cached-loop and LLM end-to-end
# benchmarks.
# Expects torch (with CUDA), triton, cmake and ninja installed. Optional extras, used when
# present: wheels in .whl/ (e.g. liger-kernel, installed to a private site dir) and a
# GoogleTest source tree in .gtest/ (used when no system GoogleTest is found).
set -uo pipefail
cd "$(dirname "$0")/.."
# Hopper only unless the caller says otherwise (e.g. TORCH_CUDA_ARCH_LIST=8.0 builds the
# portable kernels alone, to test them on this GPU): half the build time of "8.0;9.0a".
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0a}
out=${1:-${OUT:-/tmp/ltx_kernels_out}}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # (absolute: the sanitize stage writes from tests/python)
status=0
stages=${GPU_CHECK_STAGES:-cpp py bench}
want() { [[ " $stages " == *" $1 "* ]]; }

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

echo "== build (pip install --no-build-isolation .)"
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -20 || exit 1

if want cpp; then
echo "== C++ tests (GoogleTest, CUDA kernels vs CPU reference)"
gtest_flag=()
[ -d .gtest ] && gtest_flag=(-DLTX_KERNELS_GTEST_SOURCE="$PWD/.gtest")
if cmake -S . -B build/cpp -G Ninja -DLTX_KERNELS_TORCH=OFF -DLTX_KERNELS_TESTS=ON \
     -DLTX_KERNELS_CUDA=ON "${gtest_flag[@]}" > "$out/cmake.log" 2>&1 \
   && cmake --build build/cpp >> "$out/cmake.log" 2>&1; then
  (cd build/cpp && ctest --output-on-failure -R "${GPU_CHECK_CTEST:-.}" 2>&1 | tail -15) || status=1
else
  tail -30 "$out/cmake.log"; status=1
fi
fi

if want sanitize; then
echo "== compute-sanitizer on the CUDA GoogleTests (norm, attention, FP8 GEMM) and the Python CUDA tests"
for tool in memcheck racecheck synccheck initcheck; do
  compute-sanitizer --tool $tool --error-exitcode 1 build/cpp/tests/cpp/ltx_kernels_tests \
    --gtest_filter='NormCuda*:AttentionCuda*:Fp8LinearCuda*' > "$out/sanitize-$tool.log" 2>&1 || status=1
  echo "$tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$out/sanitize-$tool.log" | tr '\n' ' ')"
done
# The kernels tested from Python only (elementwise, RoPE, quantize, AdaLN / norm backward,
# short-key and Hopper attention, linear_gelu_tanh, cross-entropy): every tool over a few cases
# of each (scripts/sanitize_cases.txt), the four side by side (~200 s on an H100). initcheck
# leaves out the cross-entropy cases: it does not see cuBLAS's stores of the fp32 logits that
# those kernels read (torch's own sum of `torch.mm(x16, w16.T, out_dtype=torch.float32)` is
# flagged the same way; benchmarks/results/h100/sanitizer/README.md).
cases=$(grep -v '^#' scripts/sanitize_cases.txt)
for tool in memcheck racecheck synccheck initcheck; do
  chosen_cases=$cases
  [ $tool = initcheck ] && chosen_cases=$(grep -v test_cross_entropy <<< "$cases")
  # racecheck of the CUTLASS FP8 GEMM runs through the GoogleTests above: at the Python cases'
  # sizes it instruments every shared-memory access of the TMA pipeline for > 7 minutes.
  [ $tool = racecheck ] && chosen_cases=$(grep -v 'test_fp8.py::test_fp8_linear' <<< "$cases")
  # shellcheck disable=SC2086
  (cd tests/python && compute-sanitizer --tool $tool --error-exitcode 1 python3 -m pytest -q -p no:cacheprovider \
     -p no:benchmark -p no:xdist $chosen_cases > "$out/sanitize-python-$tool.log" 2>&1) &
done
for job in $(jobs -p); do wait "$job" || status=1; done
for tool in memcheck racecheck synccheck initcheck; do
  echo "$tool (Python cases): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|passed|failed' "$out/sanitize-python-$tool.log" | tr '\n' ' ')"
done
fi

# py: every Python test file; py1 / py2: the first / second half of them (alphabetically), for
# machines whose time per command is shorter than the whole suite. Across
# GPU_CHECK_WORKERS processes (pytest-xdist; default 15), under GPU_CHECK_PYTEST_TIMEOUT
# seconds (default none), after which pytest is interrupted and still prints what failed so far.
# GPU_CHECK_FILES (test file names, e.g. "test_hub.py test_readme.py") narrows the files to those.
if [ -n "${GPU_CHECK_FILES:-}" ]; then
  files=()
  for f in $GPU_CHECK_FILES; do files+=("tests/python/$f"); done
else
  files=(tests/python/test_*.py)
fi
half=$(( ${#files[@]} / 2 ))
for stage in py py1 py2; do
want $stage || continue
case $stage in
  py) chosen=("${files[@]}") ;;
  py1) chosen=("${files[@]:0:half}") ;;
  py2) chosen=("${files[@]:half}") ;;
esac
echo "== Python tests ($stage: ${#chosen[@]} files)"
# shellcheck disable=SC2086
timeout -s INT "${GPU_CHECK_PYTEST_TIMEOUT:-0}" python3 -m pytest "${chosen[@]}" -q -p no:cacheprovider \
  -p no:benchmark -n "${GPU_CHECK_WORKERS:-15}" -rfE --durations=10 ${GPU_CHECK_PYTEST:-} 2>&1 \
  | grep -vE "^[.sFEx]+ +\[" | tee "$out/pytest-$stage.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "== summary: pytest ($stage): $(grep -E '(passed|failed|error)' "$out/pytest-$stage.log" | tail -1)"
done

# A benchmark stage NAME: python -m MODULE ARGS..., its JSON, markdown and log as OUT/NAME.*.
bench_stage() {
  local name=$1 title=$2 module=$3
  shift 3
  want "$name" || return 0
  echo "== $title"
  python3 -m "$module" "$@" --json "$out/$name.json" --markdown "$out/$name.md" 2>&1 \
    | tee "$out/$name.log" | tail -30
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
# (the GPU_CHECK_* arguments are split into words on purpose)
# shellcheck disable=SC2086
{
bench_stage bench "benchmark" ltx_kernels.bench
bench_stage heldout "benchmark of the norm family at held-out sizes (D x rows, strided, fp16)" ltx_kernels.bench \
  --held-out
bench_stage gemm "GEMM benchmark (bf16, cuBLASLt FP8, ours FP8)" ltx_kernels.bench.gemm
bench_stage attention "attention benchmark" ltx_kernels.bench.attention
bench_stage e2e "end-to-end LTX-Video benchmark" ltx_kernels.bench.ltx_e2e ${GPU_CHECK_E2E:-}
bench_stage fidelity "fidelity benchmark (LTX-Video, final latents vs the fp32 model)" ltx_kernels.bench.fidelity \
  ${GPU_CHECK_FIDELITY:-}
bench_stage flux "end-to-end FLUX.1-dev benchmark (one step, 1024x1024)" ltx_kernels.bench.flux_e2e
bench_stage dit "end-to-end image DiT benchmark (one step; default PixArt-Sigma 1024x1024)" \
  ltx_kernels.bench.dit_e2e ${GPU_CHECK_DIT:-}
bench_stage wan "end-to-end Wan benchmark (one forward; default Wan 2.1 14B, 81 frames at 480p)" \
  ltx_kernels.bench.wan_e2e ${GPU_CHECK_WAN:-}
bench_stage ltx2 "end-to-end LTX-2 benchmark (one step, 121 frames at 768x512 with audio; 19 B: the FP8 modes need a run of their own)" \
  ltx_kernels.bench.ltx2_e2e ${GPU_CHECK_LTX2:-}
bench_stage unet "end-to-end UNet benchmark (one step; default SDXL 1024x1024)" ltx_kernels.bench.unet_e2e \
  ${GPU_CHECK_UNET:-}
bench_stage cache "end-to-end LTX-Video denoising loop with FirstBlockCache (stock vs ours vs ours + compile)" \
  ltx_kernels.bench.ltx_cache ${GPU_CHECK_CACHE:-}
bench_stage llm "end-to-end LLM benchmark (transformers, Llama-3-8B dimensions)" ltx_kernels.bench.llm_e2e \
  ${GPU_CHECK_LLM:-}
}
exit $status
