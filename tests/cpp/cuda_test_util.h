// Helpers of the CUDA GoogleTests: whether a GPU is there and which, device buffers, random inputs.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "ltx_kernels/types.h"
#include "reference/convert.h"

namespace ltx_kernels::test {

inline bool has_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Compute capability of the current GPU, major * 10 + minor.
inline int device_arch() {
  int device = 0, major = 0, minor = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor;
}

// Device copy of a host buffer, freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(const std::vector<uint8_t>& host) : bytes(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<uint8_t> to_host() const {
    std::vector<uint8_t> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
};

// `count` standard normals stored as dtype.
inline std::vector<uint8_t> random_buffer(int64_t count, DType dtype, std::mt19937& rng) {
  std::vector<uint8_t> buf(count * dtype_size(dtype));
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < count; ++i) host::store(buf.data(), i, dtype, normal(rng));
  return buf;
}

}  // namespace ltx_kernels::test
