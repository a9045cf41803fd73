// Rotary position embeddings.
//
// RopeParams: rotation by cos/sin tables, as LLMs (cos/sin from the model's rotary module)
// and diffusers' LTX-Video (precomputed fp32 tables) supply them. q and k are
// [batches, tokens, heads, head_dim] with arbitrary strides (a [B, H, S, Dh] tensor is
// passed with its strides permuted) and a contiguous last dim; the tables are
// [table batches (1 or batches), tokens, rotary_dims], shared by every head. With
//   rotate(x)[c] = -x[partner(c)] for the first element of a pair, +x[partner(c)] for the second,
//   out[c] = x[c] * cos[c] + rotate(x)[c] * sin[c]     for c <  rotary_dims (fp32 math)
//   out[c] = x[c]                                      for c >= rotary_dims
// Pairs are interleaved (2i, 2i+1), or half-split within each section: a section of n
// channels starting at s pairs (s + i, s + n/2 + i) (Llama's rotate_half is one section of
// rotary_dims channels; rope_3d uses three).
//
// LtxRopeParams: LTX-Video's rotation with the angles computed in the kernel (nothing but
// q and k is read), optionally after an RMS norm across the whole row (LTX's norm_q /
// norm_k). q and k are [batches, tokens, D] (all heads at once). Token s is the grid point
// (f, h, w) = (s / (H*W), (s / W) % H, s % W), or video_coords[b, :, s] when given, scaled
// per axis: g_a = position_a * axis_scale[a]. With K = D / 6 frequencies
//   freq_k = theta ^ (k / (K - 1)) * pi / 2     (freq_0 = pi / 2 when K = 1)
// channel c < D % 6 passes through, and channel c >= D % 6 belongs to the interleaved pair
// j = (c - D % 6) / 2 rotated by angle freq_{j/3} * (2 * g_{j%3} - 1). Angles are formed and
// reduced modulo 2 pi in fp64 (they reach 1e4-1e6 rad, where fp32 has no digits left),
// then sin and cos are taken in fp32.
#pragma once

#include <cstdint>

#include "ltx_kernels/types.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ltx_kernels {

// One rotated tensor: input and output, [batches, tokens, heads, head_dim], element strides
// of the batch, token and head dims (the last dim is contiguous).
struct RopeTensor {
  const void* in = nullptr;  // nullptr: absent (k is optional)
  int64_t in_strides[3] = {0, 0, 0};
  void* out = nullptr;
  int64_t out_strides[3] = {0, 0, 0};
  int64_t heads = 0;
};

struct RopeParams {
  DType dtype = DType::kFloat32;        // of q and k
  DType table_dtype = DType::kFloat32;  // of cos and sin: dtype or float32
  int64_t batches = 0;
  int64_t tokens = 0;
  int64_t head_dim = 0;
  RopeTensor q;
  RopeTensor k;

  bool interleaved = false;
  int64_t sections[3] = {0, 0, 0};  // rotary_dims = their sum; each even

  const void* cos = nullptr;  // [table batches, tokens, rotary_dims], last dim contiguous
  const void* sin = nullptr;  // same layout as cos
  int64_t table_batch_stride = 0;  // 0: one table for every batch
  int64_t table_token_stride = 0;
};

// constexpr so the kernels use the same definition (nvcc --expt-relaxed-constexpr).
constexpr int64_t rotary_dims(const RopeParams& p) {
  return p.sections[0] + p.sections[1] + p.sections[2];
}
ValidationError validate(const RopeParams& p);
void reference(const RopeParams& p);
// Elements per access chosen by the launcher: 16 bytes when all pointers, strides and
// section boundaries allow it, else 1.
int rope_vector(const RopeParams& p);

struct LtxRopeParams {
  DType dtype = DType::kFloat32;  // of q, k, their outputs and the norm weights
  int64_t batches = 0;
  int64_t tokens = 0;
  int64_t cols = 0;  // D

  const void* q = nullptr;  // [batches * tokens, cols], row stride q_row_stride
  int64_t q_row_stride = 0;
  void* q_out = nullptr;  // [batches * tokens, cols], contiguous
  const void* k = nullptr;  // optional, like q
  int64_t k_row_stride = 0;
  void* k_out = nullptr;

  // RMS norm of each row before the rotation: x * rsqrt(mean(x^2) + eps) [* weight].
  bool norm = false;
  float eps = 1e-5f;
  const void* q_weight = nullptr;  // [cols], optional
  const void* k_weight = nullptr;  // [cols], optional

  int64_t grid[3] = {0, 0, 0};  // (frames, height, width); their product is tokens
  const float* coords = nullptr;  // optional [batches, 3, tokens] positions, replacing grid
  int64_t coords_strides[3] = {0, 0, 0};  // batch, axis, token (elements)
  double axis_scale[3] = {1.0, 1.0, 1.0};
  double theta = 10000.0;
};

ValidationError validate(const LtxRopeParams& p);
void reference(const LtxRopeParams& p);

#ifdef LTX_KERNELS_WITH_CUDA
cudaError_t launch(const RopeParams& p, cudaStream_t stream);
cudaError_t launch(const LtxRopeParams& p, cudaStream_t stream);
#endif

}  // namespace ltx_kernels
