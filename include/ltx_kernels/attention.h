// Attention (non-causal, SDPA semantics): out = softmax(q k^T * scale + mask) v, per batch and
// head, with q [B, Hq, Sq, D], k and v [B, Hkv, Sk, D] (Hq a multiple of Hkv: grouped-query
// heads share their kv head), out [B, Hq, Sq, D]; every tensor's last dim contiguous, the
// other dims strided. An optional additive fp32 mask broadcasts over [B, H, Sq, Sk] through
// strides of 0. A query row whose keys are all masked (-inf) gets zeros, not NaN; a NaN score makes
// its row NaN.
//
// kInt8QK is the 8-bit method (SageAttention's, DESIGN.md section 6):
//   k' = k - mean(k), the mean over all Sk keys per (batch, kv head, channel), rounded to fp32
//        (exact in infinite precision: softmax ignores a per-row constant, and q . mean(k) is
//        one per query row; it moves K's channel offsets out of the 8-bit range)
//   per block of kQuantBlock tokens of one head, of q and of k' (fp32):
//     amax = max(|x| over the block, 1e-12), block scale = amax / 127,
//     x8 = clamp(round_half_even(x * (127 / amax)), -127, 127)
//   s = (q8 . k8, an exact integer) * q_scale * k_scale * scale, then the mask, softmax and
//   P v. The reference computes softmax and P v in double and rounds the output once; a GPU
//   kernel (online softmax, P rounded for the tensor cores) is held to it with a tolerance.
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

enum class AttentionPrecision : int32_t {
  kExact = 0,   // fp32 math on the inputs as they are ("bf16")
  kInt8QK = 1,  // "8bit": INT8 q and k' with per-block scales, see above
};

constexpr int kQuantBlock = 64;

// Element strides of a [B, H, S, D] tensor whose last dim is contiguous.
struct Strides4 {
  int64_t batch = 0;
  int64_t head = 0;
  int64_t seq = 0;
};

struct AttentionParams {
  DType dtype = DType::kFloat32;  // of q, k, v and out
  AttentionPrecision precision = AttentionPrecision::kExact;
  int64_t batch = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t seq_q = 0;
  int64_t seq_k = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;  // softmax scale, usually 1 / sqrt(head_dim)

  const void* q = nullptr;
  Strides4 q_strides;
  const void* k = nullptr;
  Strides4 k_strides;
  const void* v = nullptr;
  Strides4 v_strides;
  // Optional additive fp32 mask [B, Hq, Sq, Sk] (strides of 0 broadcast; -inf masks out).
  const float* mask = nullptr;
  Strides4 mask_strides;  // seq = the query row stride; keys are contiguous
  void* out = nullptr;
  Strides4 out_strides;
  // Compute capability of the GPU it runs on (major * 10 + minor): 90 takes the Hopper kernel
  // (when built for sm_90a), anything else the portable sm_80 one. Sizes the workspace too.
  int32_t arch = 0;
};

ValidationError validate(const AttentionParams& p);

// Plain CPU implementation: the definition above, fp32 math.
void reference(const AttentionParams& p);

// What the CUDA kernel supports beyond validate(): bf16 or fp16, head_dim 64 or 128, and
// every row of q, k, v 16-byte aligned (base pointers and strides). nullptr when it does.
ValidationError cuda_support(const AttentionParams& p);

// Bytes of device scratch the CUDA launch needs for p.arch (the 8-bit method's quantized q and
// k, their block scales and K's channel sums; the decode kernel's partial results).
int64_t workspace_bytes(const AttentionParams& p);

#ifdef LTX_KERNELS_WITH_CUDA
cudaError_t launch(const AttentionParams& p, void* workspace, cudaStream_t stream);
#endif

}  // namespace ltx_kernels
