// CUDA kernels of attention (include/ltx_kernels/attention.h): the 8-bit method's quantization
// pass, the portable tensor-core kernel (sm_80 and later: mma.sync, FlashAttention-2's online
// softmax), and the dispatch to the short-key kernel (attention_short.cu: at most
// kShortMaxKeys keys, exact precision), to the decode kernel (attention_decode.cu: a few query
// rows per kv head, many keys, exact precision) and to the Hopper kernel (attention_sm90.cu)
// on sm_90.
//
// One CTA computes kBlockM query rows of one (batch, head), 16 rows per warp, walking the
// keys in steps of kBlockN = kQuantBlock: the 8-bit method then has one q scale per warp and
// one k scale per step. K and V tiles are double-buffered in shared memory with cp.async
// (the next step's tiles load while this step computes); rows past the end load as zeros and
// their scores are set to -inf. Scores are kept in log2 units (softmax scale * log2(e)
// folded in) so the exponentials are exp2. P is rounded to the input dtype for the PV
// product, fp32 accumulation; the row sums use the unrounded P (as FlashAttention).
//
// The 8-bit method runs three small kernels first: K's channel sums over chunks of keys,
// then q and k (minus its mean) quantized to INT8 per block of kQuantBlock rows with the
// reference's exact arithmetic (IEEE division, unfused product, round half to even), into
// the workspace (ops/attention_workspace.h). The scores are then exact integer dot products.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <cmath>
#include <type_traits>

#include "core/convert.cuh"
#include "core/mma.cuh"
#include "core/reduce.cuh"
#include "core/activation.cuh"
#include "core/smem_tile.cuh"
#include "ltx_kernels/attention.h"
#include "ops/attention_decode.h"
#include "ops/attention_int8.cuh"
#include "ops/attention_mma.cuh"
#include "ops/attention_short.h"
#include "ops/attention_sm90.h"
#include "ops/attention_workspace.h"
#include "ops/host_util.h"

namespace ltx_kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockM = 16 * kWarps;
constexpr int kBlockN = kQuantBlock;
using core::kLog2e;

template <typename T, int D, bool INT8>
__global__ void __launch_bounds__(kThreads) attention_kernel(const AttentionParams p, const AttentionWorkspace w) {
#ifdef LTX_KERNELS_SM80_CODE
  using QK = std::conditional_t<INT8, int8_t, T>;
  using Acc = std::conditional_t<INT8, int, float>;
  constexpr int kQKRow = D * static_cast<int>(sizeof(QK));
  constexpr int kVRow = D * 2;
  constexpr int kQKSteps = kQKRow / 32;  // mma k-steps over head_dim: 32 bytes each
  constexpr int kNTiles = kBlockN / 8;   // 8-key tiles of scores per step
  constexpr int kDTiles = D / 8;         // 8-column tiles of the output
  using QTile = core::SmemTile<kBlockM, kQKRow>;
  using KTile = core::SmemTile<kBlockN, kQKRow>;
  using VTile = core::SmemTile<kBlockN, kVRow>;
  extern __shared__ char smem[];
  const uint32_t s_q = (core::smem_addr(smem) + 1023) & ~1023u;  // the swizzle's phase
  const uint32_t s_k = s_q + QTile::kBytes;
  const uint32_t s_v = s_k + 2 * KTile::kBytes;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tig = lane % 4;  // the fragment's row group and thread in group
  const int64_t b = blockIdx.z;
  const int h = blockIdx.y, hk = h / static_cast<int>(p.heads_q / p.heads_kv);
  const int m0 = blockIdx.x * kBlockM;
  const int seq_q = static_cast<int>(p.seq_q), seq_k = static_cast<int>(p.seq_k);

  const char *q_src, *k_src;
  int64_t q_stride, k_stride;
  float q_factor = p.scale * kLog2e;
  if constexpr (INT8) {
    q_src = reinterpret_cast<const char*>(w.q8 + (b * p.heads_q + h) * w.q_blocks * kQuantBlock * D);
    k_src = reinterpret_cast<const char*>(w.k8 + (b * p.heads_kv + hk) * w.k_blocks * kQuantBlock * D);
    q_stride = k_stride = D;
    q_factor *= w.q_scale[(b * p.heads_q + h) * w.q_blocks + (m0 + warp * 16) / kQuantBlock];
  } else {
    q_src = static_cast<const char*>(p.q) + (b * p.q_strides.batch + h * p.q_strides.head) * sizeof(T);
    k_src = static_cast<const char*>(p.k) + (b * p.k_strides.batch + hk * p.k_strides.head) * sizeof(T);
    q_stride = p.q_strides.seq * sizeof(T);
    k_stride = p.k_strides.seq * sizeof(T);
  }
  const char* v_src = static_cast<const char*>(p.v) + (b * p.v_strides.batch + hk * p.v_strides.head) * sizeof(T);
  const int64_t v_stride = p.v_strides.seq * sizeof(T);
  const float* k_scale = INT8 ? w.k_scale + (b * p.heads_kv + hk) * w.k_blocks : nullptr;
  const float* mask = p.mask ? p.mask + b * p.mask_strides.batch + h * p.mask_strides.head : nullptr;

  const int steps = (seq_k + kBlockN - 1) / kBlockN;
  QTile::template load<kThreads>(s_q, q_src, q_stride, m0, seq_q);
  if (steps > 0) {
    KTile::template load<kThreads>(s_k, k_src, k_stride, 0, seq_k);
    VTile::template load<kThreads>(s_v, v_src, v_stride, 0, seq_k);
  }
  core::cp_async_commit();
  core::cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[kQKSteps][4];  // this warp's 16 query rows, as mma A fragments
#pragma unroll
  for (int s = 0; s < kQKSteps; ++s)
    core::ldmatrix_x4(qf[s], s_q + QTile::offset(warp * 16 + lane % 16, 2 * s + lane / 16));

  // Rows g and g + 8 of the warp's 16: running max (log2 units), this thread's partial row
  // sum, and the output accumulators o[tile][0..1] (row g), o[tile][2..3] (row g + 8).
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  float o[kDTiles][4] = {};
  const int row_lo = m0 + warp * 16 + g;

  for (int step = 0; step < steps; ++step) {
    const int stage = step & 1;
    if (step + 1 < steps) {
      KTile::template load<kThreads>(s_k + (stage ^ 1) * KTile::kBytes, k_src, k_stride, (step + 1) * kBlockN, seq_k);
      VTile::template load<kThreads>(s_v + (stage ^ 1) * VTile::kBytes, v_src, v_stride, (step + 1) * kBlockN, seq_k);
    }
    core::cp_async_commit();
    core::cp_async_wait<1>();  // this step's tiles have landed (the next step's may not)
    __syncthreads();

    Acc acc[kNTiles][4] = {};
    const uint32_t k_tile = s_k + stage * KTile::kBytes;
#pragma unroll
    for (int j = 0; j < kNTiles; j += 2) {
#pragma unroll
      for (int s = 0; s < kQKSteps; ++s) {
        uint32_t kb[4];  // B fragments of key tiles j and j + 1
        const int mi = lane / 8;
        core::ldmatrix_x4(kb, k_tile + KTile::offset((j + mi / 2) * 8 + lane % 8, 2 * s + mi % 2));
        if constexpr (INT8) {
          core::mma_16832_s8(acc[j], qf[s], kb[0], kb[1]);
          core::mma_16832_s8(acc[j + 1], qf[s], kb[2], kb[3]);
        } else {
          core::mma_16816<T>(acc[j], qf[s], kb[0], kb[1]);
          core::mma_16816<T>(acc[j + 1], qf[s], kb[2], kb[3]);
        }
      }
    }

    // Scores in log2 units, masked; element e of tile j is row row_lo + 8 * (e / 2), key
    // n0 + 8 j + 2 tig + e % 2.
    const float factor = INT8 ? q_factor * k_scale[step] : q_factor;
    const int n0 = step * kBlockN;
    float sc[kNTiles][4];
    float step_max[2] = {row_max[0], row_max[1]};
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = row_lo + 8 * (e / 2), key = n0 + 8 * j + 2 * tig + e % 2;
        float x = static_cast<float>(acc[j][e]) * factor;
        if (mask != nullptr && row < seq_q && key < seq_k) x += mask[row * p.mask_strides.seq + key] * kLog2e;
        if (key >= seq_k) x = -INFINITY;
        sc[j][e] = x;
        step_max[e / 2] = fmaxf(step_max[e / 2], x);
      }
    }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      step_max[r] = fmaxf(step_max[r], __shfl_xor_sync(0xffffffffu, step_max[r], 1));
      step_max[r] = fmaxf(step_max[r], __shfl_xor_sync(0xffffffffu, step_max[r], 2));
      // A row with every key so far masked keeps -inf; exp2 of its scores must give 0, not NaN.
      base[r] = step_max[r] == -INFINITY ? 0.0f : step_max[r];
      const float alpha = exp2f(row_max[r] - base[r]);
      row_max[r] = step_max[r];
      row_sum[r] *= alpha;
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
        o[t][2 * r] *= alpha;
        o[t][2 * r + 1] *= alpha;
      }
    }
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[j][e] = exp2f(sc[j][e] - base[e / 2]);
        row_sum[e / 2] += sc[j][e];
      }
    }

    // o += P V, 16 keys at a time.
    const uint32_t v_tile = s_v + stage * VTile::kBytes;
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      attention_mma::pv_step<T, VTile>(o, sc[2 * kk], sc[2 * kk + 1], v_tile, kk * 16, lane);
    }
    __syncthreads();  // every warp is done with this stage before the next step refills it
  }

  T* out = static_cast<T*>(p.out) + b * p.out_strides.batch + h * p.out_strides.head;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float total = row_sum[r];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    const int row = row_lo + 8 * r;
    if (row >= seq_q) continue;
    const float inv = 1.0f / total;  // NaN scores propagate; a fully masked row (total 0) gets 0
#pragma unroll
    for (int t = 0; t < kDTiles; ++t) {
      const float x0 = total == 0.0f ? 0.0f : o[t][2 * r] * inv;
      const float x1 = total == 0.0f ? 0.0f : o[t][2 * r + 1] * inv;
      *reinterpret_cast<uint32_t*>(out + row * p.out_strides.seq + 8 * t + 2 * tig) = core::pack2<T>(x0, x1);
    }
  }
#endif
}

// ---- the 8-bit method's quantization pass ----

constexpr int kQuantThreads = 128;

// Eight consecutive elements of row `row` (16 bytes) in fp32.
template <typename T>
__device__ __forceinline__ void load8(float (&x)[8], const T* row, int chunk) {
  const uint4 raw = *reinterpret_cast<const uint4*>(row + 8 * chunk);
  const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = core::to_float(v[e]);
}

// K's per-channel sums in fp64 over one chunk of kMeanChunk keys of one (batch, kv head).
// Thread t sums channels [8 c, 8 c + 8), c = t % (D / 8), over every kRowGroups-th row; the
// row groups are then added in a fixed order.
template <typename T, int D>
__global__ void __launch_bounds__(kQuantThreads) attention_k_sums_kernel(const AttentionParams p, const AttentionWorkspace w) {
  constexpr int kChunks = D / 8, kRowGroups = kQuantThreads / kChunks;
  __shared__ double partial[kRowGroups][D];
  const int64_t b = blockIdx.z, hk = blockIdx.y;
  const int c = threadIdx.x % kChunks, group = threadIdx.x / kChunks;
  const T* k = static_cast<const T*>(p.k) + b * p.k_strides.batch + hk * p.k_strides.head;
  const int64_t first = blockIdx.x * kMeanChunk, last = min(first + kMeanChunk, p.seq_k);
  double sum[8] = {};
  for (int64_t row = first + group; row < last; row += kRowGroups) {
    float x[8];
    load8(x, k + row * p.k_strides.seq, c);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum[e] += x[e];
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) partial[group][8 * c + e] = sum[e];
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += kQuantThreads) {
    double total = 0.0;
    for (int r = 0; r < kRowGroups; ++r) total += partial[r][d];
    w.k_sums[((b * p.heads_kv + hk) * w.k_chunks + blockIdx.x) * D + d] = total;
  }
}

// K's per-channel mean: the chunks' sums added in order, in fp64, rounded once to fp32. Its own
// kernel: in each quantization block, the sums' 16+ dependent L2 reads per channel cost more
// than the block's quantization (H100, 2 x 32 x 8064 keys at head_dim 64: 139 us vs 31 for q).
template <int D>
__global__ void __launch_bounds__(D) attention_k_mean_kernel(const AttentionParams p, const AttentionWorkspace w) {
  const int64_t bk = blockIdx.x;
  const double* sums = w.k_sums + bk * w.k_chunks * D + threadIdx.x;
  double total = 0.0;
  for (int64_t chunk = 0; chunk < w.k_chunks; ++chunk) total += sums[chunk * D];
  w.k_mean[bk * D + threadIdx.x] = static_cast<float>(total / static_cast<double>(p.seq_k));
}

// One block of kQuantBlock rows of one (batch, head) of q (IS_K false) or k minus its mean,
// to INT8 with one scale, as the reference does. Rows past the end are written as zeros.
template <typename T, int D, bool IS_K>
__global__ void __launch_bounds__(kQuantThreads) attention_quantize_kernel(const AttentionParams p,
                                                                     const AttentionWorkspace w) {
  constexpr int kChunks = D / 8, kRowGroups = kQuantThreads / kChunks, kRows = kQuantBlock / kRowGroups;
  __shared__ float scratch[core::kMaxWarpsPerBlock];
  const int64_t b = blockIdx.z, h = blockIdx.y, block = blockIdx.x;
  const int c = threadIdx.x % kChunks, group = threadIdx.x / kChunks;
  const int64_t heads = IS_K ? p.heads_kv : p.heads_q, seq = IS_K ? p.seq_k : p.seq_q;
  const int64_t blocks = IS_K ? w.k_blocks : w.q_blocks;
  const Strides4& s = IS_K ? p.k_strides : p.q_strides;
  const T* x = static_cast<const T*>(IS_K ? p.k : p.q) + b * s.batch + h * s.head;

  float mean[8] = {};
  if constexpr (IS_K) {
    const float* k_mean = w.k_mean + (b * p.heads_kv + h) * D + 8 * c;
#pragma unroll
    for (int e = 0; e < 8; ++e) mean[e] = k_mean[e];
  }
  float v[kRows][8];
  float amax = 0.0f;
  const core::NanMax max_op;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int64_t row = block * kQuantBlock + group + i * kRowGroups;
    if (row < seq) {
      load8(v[i], x + row * s.seq, c);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) v[i][e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (IS_K && row < seq) v[i][e] = __fsub_rn(v[i][e], mean[e]);
      amax = max_op(amax, fabsf(v[i][e]));
    }
  }
  amax = int8_block::amax_of(core::row_reduce<kQuantThreads>(amax, scratch, max_op));
  const float inv = int8_block::inverse_of(amax);
  int8_t* out = (IS_K ? w.k8 : w.q8) + ((b * heads + h) * blocks + block) * kQuantBlock * D;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    *reinterpret_cast<uint2*>(out + (group + i * kRowGroups) * D + 8 * c) = int8_block::pack8(v[i], inv);
  }
  if (threadIdx.x == 0) (IS_K ? w.k_scale : w.q_scale)[(b * heads + h) * blocks + block] = int8_block::scale_of(amax);
}

template <typename T, int D, bool INT8>
cudaError_t launch_attention(const AttentionParams& p, const AttentionWorkspace& w, cudaStream_t stream) {
  constexpr int kQKRow = D * (INT8 ? 1 : 2);
  constexpr int kSmem = (kBlockM + 2 * kBlockN) * kQKRow + 2 * kBlockN * D * 2 + 1024;  // + base alignment
  const auto kernel = attention_kernel<T, D, INT8>;
  cudaError_t error = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (error != cudaSuccess) return error;
  const dim3 grid(static_cast<unsigned>(host_util::ceil_div(p.seq_q, kBlockM)), static_cast<unsigned>(p.heads_q),
                  static_cast<unsigned>(p.batch));
  kernel<<<grid, kThreads, kSmem, stream>>>(p, w);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t launch_typed(const AttentionParams& p, void* workspace, cudaStream_t stream) {
  const AttentionWorkspace w = attention_workspace(p, workspace);
  const bool int8 = p.precision == AttentionPrecision::kInt8QK;
  if (int8) {
    const auto grid = [&](int64_t count, int64_t heads) {
      return dim3(static_cast<unsigned>(count), static_cast<unsigned>(heads), static_cast<unsigned>(p.batch));
    };
    if (p.seq_k > 0) {
      attention_k_sums_kernel<T, D><<<grid(w.k_chunks, p.heads_kv), kQuantThreads, 0, stream>>>(p, w);
      attention_k_mean_kernel<D><<<static_cast<unsigned>(p.batch * p.heads_kv), D, 0, stream>>>(p, w);
      attention_quantize_kernel<T, D, true><<<grid(w.k_blocks, p.heads_kv), kQuantThreads, 0, stream>>>(p, w);
    }
    // (the Hopper kernel quantizes q itself, tile by tile: w has no q blocks then)
    if (w.q_blocks > 0) {
      attention_quantize_kernel<T, D, false><<<grid(w.q_blocks, p.heads_q), kQuantThreads, 0, stream>>>(p, w);
    }
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
#ifdef LTX_KERNELS_SM90A
  if (uses_hopper_kernel(p)) return launch_hopper(p, w, stream);
#endif
  return int8 ? launch_attention<T, D, true>(p, w, stream) : launch_attention<T, D, false>(p, w, stream);
}

template <typename T>
cudaError_t launch_dim(const AttentionParams& p, void* workspace, cudaStream_t stream) {
  return p.head_dim == 64 ? launch_typed<T, 64>(p, workspace, stream) : launch_typed<T, 128>(p, workspace, stream);
}

// The kernels here and in attention_short.cu are empty below sm_80 (core/mma.cuh). A GPU of
// 8.0 or newer runs them only from code built for 8.0 or newer: a build for older GPUs alone
// (TORCH_CUDA_ARCH_LIST=7.5) has the driver compile its PTX for the GPU, and the empty bodies
// with it. Checked on the code the driver picked for this device, once per device.
cudaError_t check_code_arch() {
  static std::array<std::atomic<int>, host_util::kMaxDevices> ptx{};
  int device = 0;
  if (const cudaError_t error = cudaGetDevice(&device); error != cudaSuccess) return error;
  int version = device < host_util::kMaxDevices ? ptx[device].load(std::memory_order_relaxed) : 0;
  if (version == 0) {
    cudaFuncAttributes attributes;
    if (const cudaError_t error = cudaFuncGetAttributes(&attributes, attention_kernel<__nv_bfloat16, 64, false>);
        error != cudaSuccess) {
      return error;
    }
    version = attributes.ptxVersion;
    if (device < host_util::kMaxDevices) ptx[device].store(version, std::memory_order_relaxed);
  }
  return version >= 80 ? cudaSuccess : cudaErrorNoKernelImageForDevice;
}

}  // namespace

cudaError_t launch(const AttentionParams& p, void* workspace, cudaStream_t stream) {
  if (validate(p) != nullptr || cuda_support(p) != nullptr) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.seq_q == 0) return cudaSuccess;
  if (workspace_bytes(p) > 0 && workspace == nullptr) return cudaErrorInvalidValue;
  if (const cudaError_t error = check_code_arch(); error != cudaSuccess) return error;
  if (uses_decode_kernel(p)) return launch_decode(p, workspace, stream);
  if (uses_short_kernel(p)) {
#ifdef LTX_KERNELS_SM90A
    if (p.arch / 10 == 9) return launch_short_hopper(p, stream);
#endif
    return launch_short(p, stream);
  }
  return p.dtype == DType::kBFloat16 ? launch_dim<__nv_bfloat16>(p, workspace, stream)
                                     : launch_dim<__half>(p, workspace, stream);
}

}  // namespace ltx_kernels
