// Host-side logic of attention: argument validation.
#include "ltx_kernels/attention.h"

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

}  // namespace ltx_kernels
