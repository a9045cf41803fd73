// Norm kernel plans, timed directly: every (vectors a thread x threads a row) plan of
// norm_cached_kernel for the plain RMS norm, the fused add + RMS norm and the layer norm (bf16,
// weight, layer norm with bias), at D x rows = {1536, 2048, 3072, 4096, 5120} x {64, 1000, 5376,
// 16128, 65536}, beside a device-to-device copy of the same bytes. Median of 40 launches, each
// after a 256 MB memset that flushes L2; CUDA events. The plan_norm choice is one of these rows.
// Build and run on the GPU machine from the repository root (PROBE_HEADER names the kernels
// to time: the library's, or a patched copy of them beside this file; PROBE_OLD: the kernels
// before they took 1 / cols as an argument, commit 7fadfa7 and earlier):
//   nvcc -std=c++17 -arch=sm_90a -O3 -DNDEBUG --expt-relaxed-constexpr -DLTX_KERNELS_WITH_CUDA \
//     -Iinclude -Isrc -DPROBE_TAG='"new"' -DPROBE_HEADER='"ops/norm_kernels.cuh"' \
//     -o /tmp/norm_plans benchmarks/probes/norm_plans.cu && /tmp/norm_plans
// Environment variables PROBE_ROWS / PROBE_DS (space-separated) replace the sizes, e.g.
// PROBE_ROWS="1 8 64" /tmp/norm_plans; PROBE_ADALN (set to anything) adds the AdaLN forms at
// even row counts (2 samples of rows / 2 tokens, per-sample scale / shift / gate rows, no
// weight or bias, as LTX's and FLUX's norms): adarms (adaln_rms_norm), gated_adarms
// (gated_residual_adaln_rms_norm), adalayer (adaln_layer_norm).
// Output lines: TAG KIND rows=R D=D PLAN: us (GB/s moved).
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include PROBE_HEADER
#include "probe_timer.cuh"
using namespace ltx_kernels;
using namespace ltx_kernels::norm_cuda;
using bf = __nv_bfloat16;

template <int ITEMS, int TPR, NormType TYPE, bool RES, bool MOD>
float run(NormParams p) {
  const dim3 block(TPR, kMaxCachedThreads / TPR);
  const dim3 grid((p.rows + kMaxCachedThreads / TPR - 1) / (kMaxCachedThreads / TPR));
  float inv = 1.0f / p.cols;
  auto f = [&] { norm_cached_kernel<bf, bf, bf, 8, ITEMS, TYPE, RES, TPR, MOD, false><<<grid, block>>>(p
#ifndef PROBE_OLD
  , inv
#endif
  ); };
  f(); cudaError_t e = cudaDeviceSynchronize(); if (e) { printf("err %s\n", cudaGetErrorString(e)); exit(1); }
  return probe_median_us(f, 40);
}

// kind: the op's name in the output; MOD: with the scale and shift rows (AdaLN).
template <NormType TYPE, bool RES, bool MOD = false>
void sweep(const char* kind, NormParams p) {
  const int nvec = p.cols / 8;
  auto pr = [&](const char* name, float us) {
    double gb = (RES ? 4.0 : 2.0) * p.rows * p.cols * 2 / (us * 1e3);
    printf("%s %s rows=%ld D=%ld %s: %.1f us (%.0f GB/s)\n", PROBE_TAG, kind, (long)p.rows, (long)p.cols, name, us, gb);
  };
#define TRY(I, T) if (nvec <= I * T && (I == 1 || nvec > I / 2 * T)) pr(#I "x" #T, run<I, T, TYPE, RES, MOD>(p));
  TRY(1, 256) TRY(2, 128) TRY(4, 64) TRY(8, 32) TRY(2, 256) TRY(4, 128) TRY(8, 64) TRY(4, 256) TRY(8, 128)
  TRY(1, 128) TRY(2, 64) TRY(4, 32) TRY(1, 64) TRY(2, 32)
}

static std::vector<long> sizes(const char* env, std::vector<long> fallback) {
  const char* s = std::getenv(env);
  if (s == nullptr) return fallback;
  std::vector<long> out;
  for (char* end; *s; s = end) {
    const long v = std::strtol(s, &end, 10);
    if (end == s) break;
    out.push_back(v);
  }
  return out;
}

int main() {
  const long maxel = 65536L * 5120;
  bf *x, *w, *b, *out, *res, *newres; cudaMalloc(&x, maxel * 2); cudaMalloc(&out, maxel * 2);
  cudaMalloc(&res, maxel * 2); cudaMalloc(&newres, maxel * 2);
  cudaMalloc(&w, 2 * 8192 * 2); cudaMalloc(&b, 2 * 8192 * 2);
  std::vector<bf> h(maxel);
  for (long i = 0; i < maxel; ++i) h[i] = __float2bfloat16((float)((i * 2654435761u) % 1000) / 500.0f - 1.0f + 0.3f);
  cudaMemcpy(x, h.data(), maxel * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(res, h.data(), maxel * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(w, h.data(), 2 * 8192 * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(b, h.data() + 5, 2 * 8192 * 2, cudaMemcpyHostToDevice);
  const bool modulated = std::getenv("PROBE_ADALN") != nullptr;
  for (long D : sizes("PROBE_DS", {2048L, 3072L, 4096L, 1536L, 5120L}))
  for (long rows : sizes("PROBE_ROWS", {64L, 1000L, 5376L, 16128L, 65536L})) {
    if (rows * D > maxel) continue;
    NormParams p; p.dtype = DType::kBFloat16; p.weight_dtype = DType::kBFloat16; p.out_dtype = DType::kBFloat16;
    p.rows = rows; p.cols = D; p.x = x; p.x_row_stride = D; p.weight = w; p.out = out; p.out_row_stride = D;
    p.eps = 1e-6f;
    {
      auto us = probe_median_us([&] { cudaMemcpyAsync(out, x, rows * D * 2, cudaMemcpyDeviceToDevice); }, 40);
      printf("%s copy rows=%ld D=%ld: %.1f us (%.0f GB/s)\n", PROBE_TAG, rows, D, us, 2.0 * rows * D * 2 / (us * 1e3));
    }
    sweep<NormType::kRms, false>("rms", p);
    p.residual = res; p.residual_row_stride = D; p.new_residual = newres; p.new_residual_row_stride = D;
    sweep<NormType::kRms, true>("addrms", p);
    p.residual = nullptr; p.new_residual = nullptr;
    p.type = NormType::kLayer; p.bias = b;
    sweep<NormType::kLayer, false>("layer", p);
    if (!modulated || rows % 2) continue;
    // The AdaLN forms as a DiT with CFG calls them: 2 samples, one scale / shift / gate row each.
    NormParams m = p;
    m.tokens = rows / 2;
    m.scale = RowVectors{w, D, 0}; m.shift = RowVectors{b, D, 0};
    m.type = NormType::kRms; m.bias = nullptr; m.weight = nullptr;  // LTX: norms without weight
    sweep<NormType::kRms, false, true>("adarms", m);
    m.residual = res; m.residual_row_stride = D; m.new_residual = newres; m.new_residual_row_stride = D;
    m.gate = RowVectors{w, D, 0};
    sweep<NormType::kRms, true, true>("gated_adarms", m);
    m.residual = nullptr; m.new_residual = nullptr; m.gate = RowVectors{};
    m.type = NormType::kLayer;
    sweep<NormType::kLayer, false, true>("adalayer", m);
  }
}
