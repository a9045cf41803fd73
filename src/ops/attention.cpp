// Host-side logic of attention: argument validation, what the CUDA kernel supports, the size
// of its scratch.
#include "ltx_kernels/attention.h"

#include "ops/attention_workspace.h"

namespace ltx_kernels {

ValidationError validate(const AttentionParams& p) {
  if (p.batch < 0 || p.seq_q < 0 || p.seq_k < 0) return "batch and sequence lengths must be >= 0";
  if (p.heads_q < 1 || p.heads_kv < 1) return "head counts must be >= 1";
  if (p.heads_q % p.heads_kv != 0) return "heads_q must be a multiple of heads_kv";
  if (p.head_dim < 1) return "head_dim must be >= 1";
  if (p.precision != AttentionPrecision::kExact && p.precision != AttentionPrecision::kInt8QK)
    return "unknown precision";
  if (p.batch == 0 || p.seq_q == 0) return nullptr;
  if (p.q == nullptr || p.out == nullptr) return "q and out must not be null";
  if (p.seq_k > 0 && (p.k == nullptr || p.v == nullptr)) return "k and v must not be null";
  return nullptr;
}

ValidationError cuda_support(const AttentionParams& p) {
  if (p.dtype != DType::kBFloat16 && p.dtype != DType::kFloat16) return "q, k and v must be bfloat16 or float16";
  if (p.head_dim != 64 && p.head_dim != 128) return "head_dim must be 64 or 128";
  // Grid dimensions y and z (heads, batch) and 32-bit row indices.
  if (p.heads_q > 65535 || p.batch > 65535) return "batch and heads must be <= 65535";
  if (p.seq_q >= (int64_t{1} << 31) || p.seq_k >= (int64_t{1} << 31)) return "sequence lengths must be < 2^31";
  const auto aligned = [](const void* ptr, const Strides4& s) {
    // 8 elements of 2 bytes: each row starts on a 16-byte boundary.
    return host_util::aligned16(ptr) && s.batch % 8 == 0 && s.head % 8 == 0 && s.seq % 8 == 0;
  };
  if (!aligned(p.q, p.q_strides) || !aligned(p.k, p.k_strides) || !aligned(p.v, p.v_strides) ||
      !aligned(p.out, p.out_strides))
    return "every row of q, k, v and out must start 16-byte aligned";
  return nullptr;
}

int64_t workspace_bytes(const AttentionParams& p) { return attention_workspace(p, nullptr).bytes; }

}  // namespace ltx_kernels
