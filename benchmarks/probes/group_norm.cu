// group_norm's CUDA launcher (stats, finalize, apply), timed directly at SDXL's, SD 1.5's and
// held-out shapes in both layouts, bf16, with SiLU, with and without the time-embedding add,
// beside a device-to-device copy of x's bytes (read + write). Median of 40 launches, each after
// a 256 MB memset that flushes L2; CUDA events. PROBE_SOURCE names the launcher's source: the
// library's, or an earlier version of it (a copy from git) to compare with. Build and run on the
// GPU machine from the repository root:
//   nvcc -std=c++17 -arch=sm_90a -O3 -DNDEBUG --expt-relaxed-constexpr -DLTX_KERNELS_WITH_CUDA \
//     -Iinclude -Isrc -DPROBE_TAG='"new"' -DPROBE_SOURCE='"ops/group_norm.cu"' \
//     -o /tmp/group_norm_probe benchmarks/probes/group_norm.cu src/ops/group_norm.cpp && /tmp/group_norm_probe
// Output lines: TAG LAYOUT N C H W add=A: us (GB/s of the bytes that must move) copy us.
// PROBE_ONCE=1 launches each case once, untimed: for a per-kernel split under a profiler, e.g.
//   PROBE_ONCE=1 ncu --cache-control none --metrics gpu__time_duration.sum /tmp/group_norm_probe
#include <cuda_bf16.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include PROBE_SOURCE
#include "probe_timer.cuh"
using namespace ltx_kernels;

int main() {
  struct Shape { long n, c, h, w; };
  const Shape shapes[] = {{2, 320, 128, 128}, {2, 640, 64, 64}, {2, 1280, 32, 32}, {2, 1280, 8, 8},
                          {3, 96, 75, 53},    {1, 128, 256, 256}, {4, 512, 64, 64}, {2, 2560, 16, 16},
                          {1, 30, 101, 3},    {2, 960, 96, 96}};
  for (const Shape& s : shapes) {
    const long elems = s.n * s.c * s.h * s.w;
    void *x, *out, *add, *weight, *bias;
    cudaMalloc(&x, elems * 2);
    cudaMalloc(&out, elems * 2);
    cudaMalloc(&add, s.n * s.c * 2);
    cudaMalloc(&weight, s.c * 2);
    cudaMalloc(&bias, s.c * 2);
    std::vector<__nv_bfloat16> host(elems);
    for (long i = 0; i < elems; ++i) host[i] = __float2bfloat16(static_cast<float>((i * 7919) % 1000) / 500.0f - 1.0f);
    cudaMemcpy(x, host.data(), elems * 2, cudaMemcpyHostToDevice);
    cudaMemset(add, 0, s.n * s.c * 2);
    cudaMemset(weight, 0x3f, s.c * 2);
    cudaMemset(bias, 0, s.c * 2);
    const float copy = probe_median_us([&] { cudaMemcpyAsync(out, x, elems * 2, cudaMemcpyDeviceToDevice); }, 40);
    for (int last = 0; last < 2; ++last) {
      for (int with_add = 0; with_add < 2; ++with_add) {
        GroupNormParams p;
        p.dtype = DType::kBFloat16;
        p.weight_dtype = DType::kBFloat16;
        p.batch = s.n, p.channels = s.c, p.spatial = s.h * s.w, p.groups = s.c % 32 == 0 ? 32 : 5;
        p.channels_last = last, p.silu = true;
        p.x = x, p.add = with_add ? add : nullptr, p.weight = weight, p.bias = bias, p.out = out;
        float* workspace;
        cudaMalloc(&workspace, workspace_floats(p) * 4);
        const auto f = [&] { launch(p, workspace, 0); };
        f();
        const cudaError_t e = cudaDeviceSynchronize();
        if (e) {
          printf("error %s\n", cudaGetErrorString(e));
          return 1;
        }
        if (std::getenv("PROBE_ONCE") != nullptr) {  // one launch each, for a profiler's per-kernel split
          cudaFree(workspace);
          continue;
        }
        const float us = probe_median_us(f, 40);
        printf("%s %s %ld %ld %ld %ld add=%d: %.1f us (%.0f GB/s) copy %.1f us\n", PROBE_TAG, last ? "nhwc" : "nchw",
               s.n, s.c, s.h, s.w, with_add, us, 2.0 * elems * 2 / (us * 1e3), copy);
        cudaFree(workspace);
      }
    }
    cudaFree(x), cudaFree(out), cudaFree(add), cudaFree(weight), cudaFree(bias);
  }
  return 0;
}
