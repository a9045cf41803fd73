// The grid of a persistent kernel: as many CTAs as the GPU holds at once (CTAs per SM, from
// the occupancy calculator, times SMs), its dynamic shared memory allowed first. Cached per
// kernel (the template argument) and device: the launches themselves stay free of driver calls.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>

#include "ops/host_util.h"

namespace ltx_kernels {

template <auto KERNEL>
cudaError_t persistent_grid(int threads, int smem_bytes, int* grid) {
  static std::array<std::atomic<int>, host_util::kMaxDevices> grids{};
  int device = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
  *grid = device < host_util::kMaxDevices ? grids[device].load(std::memory_order_relaxed) : 0;
  if (*grid > 0) return cudaSuccess;
  int sms = 0, per_sm = 0;
  cudaError_t error = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (error == cudaSuccess) error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (error == cudaSuccess) error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, KERNEL, threads, smem_bytes);
  if (error != cudaSuccess) return error;
  if (per_sm < 1) return cudaErrorInvalidConfiguration;
  *grid = sms * per_sm;
  if (device < host_util::kMaxDevices) grids[device].store(*grid, std::memory_order_relaxed);
  return cudaSuccess;
}

}  // namespace ltx_kernels
