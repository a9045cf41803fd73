// The attention launcher (ltx_kernels::launch: the 8-bit method's quantization pass, then the
// Hopper kernel), timed directly at LTX's, FLUX's and held-out shapes, bf16, both precisions:
// the median of 20 launches (probe_timer.cuh); TFLOPS count 4 * B * H * Sq * Sk * D; err: the
// relative L2 distance of the output to the exact (bf16) kernel's on the same randn-like inputs
// (the 8-bit method's error, give or take bf16's 2e-3). First, each precision's output at a few
// small shapes against the CPU reference (max |diff| over max |ref|, and the relative L2
// distance; PROBE_NO_CHECK skips it). PROBE_SOURCE names the Hopper kernel's source: the
// library's, or a patched copy of it (e.g. under .scratch/, with -I.) to compare with in the
// same call. Build and run on the GPU machine from the repository root ($CUTLASS: the
// nvidia-cutlass wheel's cutlass_library/source/include):
//   nvcc -std=c++17 -arch=sm_90a -O3 -DNDEBUG --expt-relaxed-constexpr -DLTX_KERNELS_WITH_CUDA \
//     -DLTX_KERNELS_SM90A -I. -Iinclude -Isrc -isystem $CUTLASS -DPROBE_TAG='"new"' \
//     -DPROBE_SOURCE='"ops/attention_sm90.cu"' -o /tmp/attention_probe benchmarks/probes/attention_sm90.cu \
//     src/ops/attention.cu src/ops/attention_short.cu src/ops/attention_decode.cu src/ops/attention.cpp \
//     src/reference/attention.cpp -lcuda
// PROBE_SHAPES (B,H,S,D quadruples, space-separated, e.g. "2,32,8064,64") replaces the shapes.
// Output lines: TAG check PRECISION B H Sq Sk D: max_rel l2; TAG PRECISION B H S D: us TFLOPS err.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include PROBE_SOURCE
#include "probe_timer.cuh"
#include "ltx_kernels/attention.h"
using namespace ltx_kernels;

// Standard-normal-ish bf16 values from a fixed LCG (sums of uniforms), the same in every build.
__global__ void fill_kernel(__nv_bfloat16* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t s = seed ^ static_cast<uint32_t>(i * 2654435761u);
    float acc = 0.0f;
    for (int k = 0; k < 4; ++k) {
      s = s * 1664525u + 1013904223u;
      acc += (s >> 8) * (1.0f / 16777216.0f);
    }
    x[i] = __float2bfloat16((acc - 2.0f) * 1.7320508f);
  }
}

const AttentionPrecision kPrecisions[] = {AttentionPrecision::kExact, AttentionPrecision::kInt8QK};
const char* name(AttentionPrecision p) { return p == AttentionPrecision::kExact ? "bf16" : "8bit"; }

AttentionParams params(AttentionPrecision precision, long b, long h, long sq, long sk, long d, int arch) {
  AttentionParams p;
  p.dtype = DType::kBFloat16;
  p.precision = precision;
  p.batch = b, p.heads_q = h, p.heads_kv = h, p.seq_q = sq, p.seq_k = sk, p.head_dim = d;
  p.scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.q_strides = p.out_strides = Strides4{h * sq * d, sq * d, d};
  p.k_strides = p.v_strides = Strides4{h * sk * d, sk * d, d};
  p.arch = arch;
  return p;
}

float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }

// The relative L2 distance of `a` to `e`, and the largest |a - e| over the largest |e| (inf
// where a holds a NaN).
struct Distance {
  double l2, max_rel;
};
Distance distance(const std::vector<__nv_bfloat16>& a, const std::vector<__nv_bfloat16>& e) {
  double num = 0, den = 0, max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = to_f(a[i]), y = to_f(e[i]);
    num += (x - y) * (x - y), den += y * y;
    max_diff = x != x ? INFINITY : std::max(max_diff, std::fabs(x - y)), max_ref = std::max(max_ref, std::fabs(y));
  }
  return {std::sqrt(num / den), max_diff / max_ref};
}

std::vector<__nv_bfloat16> to_host(const __nv_bfloat16* x, long n) {
  std::vector<__nv_bfloat16> h(n);
  cudaMemcpy(h.data(), x, n * 2, cudaMemcpyDeviceToHost);
  return h;
}

// Each precision at (B, H, Sq, Sk, D) against the CPU reference on the same inputs.
void check(long b, long h, long sq, long sk, long d, int arch) {
  const long nq = b * h * sq * d, nk = b * h * sk * d;
  __nv_bfloat16 *q, *k, *v, *out;
  cudaMalloc(&q, nq * 2), cudaMalloc(&k, nk * 2), cudaMalloc(&v, nk * 2), cudaMalloc(&out, nq * 2);
  fill_kernel<<<64, 256>>>(q, nq, 11), fill_kernel<<<64, 256>>>(k, nk, 12), fill_kernel<<<64, 256>>>(v, nk, 13);
  const std::vector<__nv_bfloat16> hq = to_host(q, nq), hk = to_host(k, nk), hv = to_host(v, nk);
  std::vector<__nv_bfloat16> href(nq);
  for (AttentionPrecision precision : kPrecisions) {
    AttentionParams p = params(precision, b, h, sq, sk, d, arch);
    p.q = q, p.k = k, p.v = v, p.out = out;
    void* workspace = nullptr;
    if (const int64_t bytes = workspace_bytes(p); bytes > 0) cudaMalloc(&workspace, bytes);
    cudaError_t error = launch(p, workspace, nullptr);
    if (error == cudaSuccess) error = cudaDeviceSynchronize();
    const std::vector<__nv_bfloat16> hout = to_host(out, nq);
    if (workspace) cudaFree(workspace);
    AttentionParams r = p;
    r.q = hq.data(), r.k = hk.data(), r.v = hv.data(), r.out = href.data();
    reference(r);
    const Distance dist = distance(hout, href);
    std::printf("%s check %s %ld %ld %ld %ld %ld: %s max_rel %.2e l2 %.2e\n", PROBE_TAG, name(precision), b, h, sq,
                sk, d, cudaGetErrorString(error), dist.max_rel, dist.l2);
  }
  cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out);
}

int main() {
  struct Shape { long b, h, s, d; };
  std::vector<Shape> shapes = {{2, 32, 2688, 64}, {2, 32, 8064, 64}, {2, 32, 8064, 128}, {1, 24, 4608, 128},
                               {1, 32, 31680, 64}, {4, 16, 1000, 128}, {1, 8, 3333, 64}};
  if (const char* env = std::getenv("PROBE_SHAPES")) {
    shapes.clear();
    std::string list(env);
    size_t pos = 0;
    while (pos < list.size()) {
      Shape s{};
      if (std::sscanf(list.c_str() + pos, "%ld,%ld,%ld,%ld", &s.b, &s.h, &s.s, &s.d) == 4) shapes.push_back(s);
      pos = list.find(' ', pos);
      if (pos == std::string::npos) break;
      ++pos;
    }
  }
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  const int arch = major * 10 + minor;
  if (!std::getenv("PROBE_NO_CHECK")) {
    check(1, 2, 300, 300, 64, arch), check(1, 2, 129, 200, 128, arch), check(2, 1, 70, 1000, 64, arch);
    check(1, 1, 64, 8191, 128, arch);
  }
  for (const Shape& s : shapes) {
    const int64_t elems = s.b * s.h * s.s * s.d;
    __nv_bfloat16 *q, *k, *v, *out, *exact;
    cudaMalloc(&q, elems * 2);
    cudaMalloc(&k, elems * 2);
    cudaMalloc(&v, elems * 2);
    cudaMalloc(&out, elems * 2);
    cudaMalloc(&exact, elems * 2);
    fill_kernel<<<1024, 256>>>(q, elems, 1);
    fill_kernel<<<1024, 256>>>(k, elems, 2);
    fill_kernel<<<1024, 256>>>(v, elems, 3);
    for (AttentionPrecision precision : kPrecisions) {
      AttentionParams p = params(precision, s.b, s.h, s.s, s.s, s.d, arch);
      p.q = q, p.k = k, p.v = v, p.out = precision == AttentionPrecision::kExact ? exact : out;
      void* workspace = nullptr;
      const int64_t bytes = workspace_bytes(p);
      if (bytes > 0) cudaMalloc(&workspace, bytes);
      cudaError_t error = launch(p, workspace, nullptr);
      if (error == cudaSuccess) error = cudaDeviceSynchronize();
      if (error != cudaSuccess) {
        std::printf("%s error %s\n", PROBE_TAG, cudaGetErrorString(error));
        return 1;
      }
      const float us = probe_median_us([&] { launch(p, workspace, nullptr); }, 20);
      const double flops = 4.0 * s.b * s.h * double(s.s) * s.s * s.d;
      const double err = precision == AttentionPrecision::kExact ? 0.0 : distance(to_host(out, elems), to_host(exact, elems)).l2;
      std::printf("%s %s %ld %ld %ld %ld: %.1f us %.0f TFLOPS err %.2e\n", PROBE_TAG, name(precision), s.b, s.h,
                  s.s, s.d, us, flops / us * 1e-6, err);
      std::fflush(stdout);
      if (workspace) cudaFree(workspace);
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(out), cudaFree(exact);
  }
  return 0;
}
