// The probes' timer: the median of `reps` launches of f, each after a 256 MB memset that
// flushes L2 (so every launch reads from DRAM, as in a model's step), timed with CUDA events.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

template <typename F>
float probe_median_us(F f, int reps) {
  static char* flush = nullptr;
  if (flush == nullptr) cudaMalloc(&flush, 256 << 20);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> ts;
  for (int r = 0; r < reps; ++r) {
    cudaMemsetAsync(flush, r, 256 << 20);
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, a, b);
    ts.push_back(ms * 1000.0f);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}
