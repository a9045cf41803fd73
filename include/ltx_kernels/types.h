// Types shared by every op: element dtypes and the result of validating a params struct.
// Torch-free and CUDA-free so the CPU reference and plain C++ users can include it.
#pragma once

#include <cstdint>

namespace ltx_kernels {

enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int dtype_size(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

// One [cols] vector per row, broadcast over rows. The rows are seen as [batches, tokens]
// (rows = batches * tokens); row r uses the vector at
//   ptr + (r / tokens) * batch_stride + (r % tokens) * token_stride   (elements)
// so strides (0, 0) is one [cols] vector, (s, 0) one per batch ([B, 1, D]) and (s, t) one
// per token ([B, S, D], possibly a strided view such as LTX's unbind of [B, S, 6, D]).
struct RowVectors {
  const void* ptr = nullptr;  // nullptr: absent
  int64_t batch_stride = 0;
  int64_t token_stride = 0;
};

// nullptr when a params struct can be run, otherwise a message saying what is wrong.
// Launchers refuse (cudaErrorInvalidValue) whatever this rejects, so bad params never
// reach a kernel; the torch layer checks tensors first and names the argument.
using ValidationError = const char*;

}  // namespace ltx_kernels
