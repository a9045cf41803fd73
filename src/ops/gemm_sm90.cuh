// What the library's CUTLASS 3 GEMMs on Hopper share beyond their types: the current device
// and its SM count (the persistent grid's size), the persistent scheduler's swizzle rule, and
// the launch (fp8_linear_sm90.cu's FP8 GEMM, linear_gated_residual_sm90.cu's 16-bit one).
#pragma once

#include "ops/host_util.h"

#include <array>
#include <atomic>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/device_kernel.h>

namespace ltx_kernels::gemm_sm90 {

using host_util::kMaxDevices;

// The current device and its SM count, cached per device.
struct Device {
  int index = 0;
  int sm_count = 0;
};

inline Device current_device() {
  static std::array<std::atomic<int>, kMaxDevices> sm_counts{};
  Device d;
  cudaGetDevice(&d.index);
  if (d.index < kMaxDevices) d.sm_count = sm_counts[d.index].load(std::memory_order_relaxed);
  if (d.sm_count == 0) {
    cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, d.index);
    if (d.index < kMaxDevices) sm_counts[d.index].store(d.sm_count, std::memory_order_relaxed);
  }
  return d;
}

// The persistent scheduler's swizzle: 8 rows of output tiles walked together instead of 1.
// CUTLASS walks the tiles along N (where tiles_m >= tiles_n), so where N spans many tiles a
// wave of one tile per SM covers one row of tiles and streams all of B through L2 each wave;
// grouping 8 rows keeps a wave's B columns few. With the FP8 kernel (H100, gemm_pingpong.md)
// it pays only at 128 tiles of N and more: 12288 x 4096 -> 16384 1367 -> 1258 us (gated 1468
// -> 1371); at 64-112 tiles of N it costs up to 33% (4608 x 3072 -> 12288: 242 -> 321 us), at
// fewer up to 2x (4608 x 15360 -> 3072: 322 -> 593 us), the gated form as much.
inline int swizzle(int64_t n, int tile_n) { return (n + tile_n - 1) / tile_n >= 128 ? 8 : 1; }

// The kernel's shared memory exceeds the default 48 KiB: allowed once per device.
template <typename Kernel>
cudaError_t allow_shared_memory(int device) {
  static std::array<std::atomic<bool>, kMaxDevices> allowed{};
  if (device < kMaxDevices && allowed[device].load(std::memory_order_acquire)) return cudaSuccess;
  const cudaError_t error = cudaFuncSetAttribute(&cutlass::device_kernel<Kernel>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(Kernel::SharedStorageSize));
  if (error == cudaSuccess && device < kMaxDevices) allowed[device].store(true, std::memory_order_release);
  return error;
}

// Runs Gemm (a GemmUniversalAdapter) on args. CUTLASS's GemmUniversalAdapter::run(args) sets
// two kernel attributes (the shared memory size, the cluster size) with driver calls on every
// launch: host time that an eager LTX step, ~280 of these GEMMs, pays in full where its GPU
// work is shorter than its launches (H100, 49 frames, before this: 41.8 ms of host time for
// ~31 ms of kernels). Here the shared memory size is set once per device, and the kernel is
// launched with its cluster shape as a launch attribute, from the parameters CUTLASS builds.
template <typename Gemm>
cudaError_t run(const typename Gemm::Arguments& args, int device, void* workspace, cudaStream_t stream) {
  using Kernel = typename Gemm::GemmKernel;
  using ClusterShape = typename Kernel::ClusterShape;
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (Kernel::initialize_workspace(args, workspace, stream) != cutlass::Status::kSuccess) {
    return cudaErrorInvalidValue;
  }
  if (const cudaError_t error = allow_shared_memory<Kernel>(device); error != cudaSuccess) return error;
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = cute::size<0>(ClusterShape{});
  cluster.val.clusterDim.y = cute::size<1>(ClusterShape{});
  cluster.val.clusterDim.z = cute::size<2>(ClusterShape{});
  cudaLaunchConfig_t config = {};
  config.gridDim = Kernel::get_grid_shape(params);
  config.blockDim = Kernel::get_block_shape();
  config.dynamicSmemBytes = Kernel::SharedStorageSize;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  void* kernel_args[] = {&params};
  return cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(&cutlass::device_kernel<Kernel>), kernel_args);
}

}  // namespace ltx_kernels::gemm_sm90
