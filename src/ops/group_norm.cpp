// Host-side logic of group_norm: argument validation.
#include "ltx_kernels/group_norm.h"

namespace ltx_kernels {

ValidationError validate(const GroupNormParams& p) {
  if (p.batch < 0 || p.spatial < 0) return "batch and spatial must be >= 0";
  if (p.channels < 1) return "channels must be >= 1";
  if (p.groups < 1) return "groups must be >= 1";
  if (p.channels % p.groups != 0) return "channels must be a multiple of groups";
  if (!(p.eps >= 0.0f)) return "eps must be >= 0";
  if (p.weight_dtype != p.dtype && p.weight_dtype != DType::kFloat32) return "weight_dtype must be dtype or float32";
  if (p.batch == 0 || p.spatial == 0) return nullptr;
  if (p.x == nullptr) return "x is null";
  if (p.out == nullptr) return "out is null";
  return nullptr;
}

}  // namespace ltx_kernels
