// The FP8 linear on Hopper (include/ltx_kernels/fp8_linear.h): a CUTLASS 3 GEMM, sm_90a. TMA
// loads, warp-specialized "ping-pong" (one producer warp, two consumer warpgroups that each own
// a 128 x 128 output tile and take turns at the tensor cores, so that one's epilogue runs while
// the other's mainloop does), persistent over the output tiles, clusters of two CTAs along N
// sharing (multicasting) their A tiles. The row-wise scales and the bias (and the gated
// residual) are an epilogue visitor tree, applied to the fp32 accumulator before one rounding.
// This is the configuration cuBLASLt picks for FP8 at these shapes (nvjet 128x128, 6 stages,
// 1x2 cluster). Against the cooperative 128 x 256 tile with a 2 x 1 cluster used before, on the
// H100 (benchmarks/results/h100/gemm_pingpong.md): faster at 8 of 12 shapes (FLUX's 4608 x 3072
// -> 12288 266 -> 242 us, its gated form 379 -> 263 us), even at 2, slower at FLUX's image
// FF down projection (208 -> 227 us) and at 1000 x 3072 -> 3072 (24 -> 26 us, which now
// takes cuBLASLt: src/torch/quantize.cpp). (CUTLASS's stream-K scheduler, tried for partial
// last waves, made the whole-wave shapes up to 11% slower: gemm_stream_k.md.)
//
// Accumulation: the tensor cores' own FP8 accumulator over all of k ("fast accumulation").
// Promoting it to fp32 registers every k-block of 128 needs a second 64 x 256 fp32 accumulator
// per consumer thread (register spills at this tile), and the 128 x 128 tiles that fit it ran
// 800-1000 TFLOPS at the LTX shapes against 1140-1400 here (H100, measured when choosing). Its
// error (1.5e-3 of the rms at k = 3072, measured) is small beside e4m3's own 2.6e-2.
#include "core/activation.cuh"
#include "ltx_kernels/fp8_linear.h"
#include "ops/gemm_sm90.cuh"

#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

namespace ltx_kernels {
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// GELU-tanh of each element of an epilogue fragment (core/activation.cuh's form, as every
// GELU of the library), the node of fp8_linear's fused activation. (Sm90Compute instantiates
// it for the fragment type; the scalar form only names its (no) arguments.)
template <class T>
struct GeluTanh {};
template <int N>
struct GeluTanh<cutlass::Array<float, N>> {
  __device__ cutlass::Array<float, N> operator()(const cutlass::Array<float, N>& x) const {
    cutlass::Array<float, N> y;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) y[i] = core::gelu_tanh(x[i]);
    return y;
  }
};

// The epilogue forms of fp8_linear.h. kGatedResidual: a batched GEMM of m / batch_rows batches
// of batch_rows rows (the weight shared by all: a static zero batch stride, which TMA drops),
// so that the gate is a row broadcast per batch; the residual is the epilogue's source C.
enum class Form { kPlain, kGeluTanh, kGatedResidual };

template <typename ElementOut, Form kForm>
struct Fp8Gemm {
  static constexpr bool kGated = kForm == Form::kGatedResidual;
  using ElementAB = cutlass::float_e4m3_t;
  using TileShape = Shape<_128, _128, _128>;
  using ClusterShape = Shape<_1, _2, _1>;  // pairs of CTAs share (multicast) their A tiles
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using RowBatchStride = cute::conditional_t<kGated, int64_t, _0>;

  // out = (acc * a_scale[m]) * b_scale[n] + bias[n]: fp32, rounded once to ElementOut. A null
  // bias pointer reads as zeros. GELU: out = gelu_tanh(the same in fp32), rounded once. Gated:
  // out = residual + gate * (the same in fp32), rounded once (no gate: ones).
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using AScale = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, RowBatchStride>>;
  using BScale = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, _0>>;
  using Bias = fusion::Sm90RowBroadcast<0, TileShape, ElementOut, float, Stride<_0, _1, _0>>;
  using Gate = fusion::Sm90RowBroadcast<0, TileShape, ElementOut, float, Stride<_0, _1, int64_t>>;
  using Multiply = fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>;
  using Scaled = fusion::Sm90EVT<Multiply, fusion::Sm90EVT<Multiply, fusion::Sm90AccFetch, AScale>, BScale>;
  using Plain = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, ElementOut, float, kRound>, Scaled, Bias>;
  using Biased = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, float, float, kRound>, Scaled, Bias>;
  using Gelu = fusion::Sm90EVT<fusion::Sm90Compute<GeluTanh, ElementOut, float, kRound>, Biased>;
  using Gated = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementOut, float, kRound>,  // gate * y + residual
      Gate, Biased, fusion::Sm90SrcFetch<ElementOut>>;
  using Epilogue = cute::conditional_t<kGated, Gated, cute::conditional_t<kForm == Form::kGeluTanh, Gelu, Plain>>;
  using ElementC = cute::conditional_t<kGated, ElementOut, void>;
  // [n, k] weight: column-major B; gated, with the batch stride a static zero.
  using LayoutB = cute::conditional_t<kGated, Stride<int64_t, _1, _0>, cutlass::layout::ColumnMajor>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, cutlass::layout::RowMajor,
      16 / sizeof(ElementOut), ElementOut, cutlass::layout::RowMajor, 16 / sizeof(ElementOut), EpilogueSchedule,
      Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cutlass::layout::RowMajor, 16, ElementAB,
      LayoutB, 16, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const Fp8LinearParams& p, int sm_count) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    // Plain: one batch of m rows. Gated: m / batch_rows batches, each batch_rows rows on.
    const int64_t rows = kGated ? p.batch_rows : p.m;
    const int batches = static_cast<int>(p.m / rows);
    const int n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    const auto batch_stride = [rows](int64_t row_stride) { return rows * row_stride; };
    StrideA stride_a = make_stride(p.a_row_stride, _1{}, batch_stride(p.a_row_stride));
    StrideB stride_b{};
    get<0>(stride_b) = p.b_row_stride;
    StrideD stride_d = make_stride(p.out_row_stride, _1{}, batch_stride(p.out_row_stride));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(rows), n, k, batches},
        {reinterpret_cast<const ElementAB*>(p.a), stride_a, reinterpret_cast<const ElementAB*>(p.b), stride_b},
        {},
    };
    args.epilogue.ptr_D = static_cast<ElementOut*>(p.out);
    args.epilogue.dD = stride_d;
    // The tree's arguments nest as its nodes: {children..., the node's own}.
    typename AScale::Arguments a_scale{p.a_scale};
    if constexpr (kGated) get<2>(a_scale.dCol) = rows;
    const typename Scaled::Arguments scaled = {{{}, a_scale, {}}, {p.b_scale}, {}};
    if constexpr (kGated) {
      args.epilogue.ptr_C = static_cast<const ElementOut*>(p.residual);
      args.epilogue.dC = StrideC(make_stride(p.residual_row_stride, _1{}, batch_stride(p.residual_row_stride)));
      args.epilogue.thread = {
          // (no gate: a null row pointer reads as the broadcast of this default, ones)
          {static_cast<const ElementOut*>(p.gate), ElementOut(1), {_0{}, _1{}, p.gate_batch_stride}},
          {scaled, {static_cast<const ElementOut*>(p.bias)}, {}},
          {},
          {},
      };
    } else if constexpr (kForm == Form::kGeluTanh) {
      args.epilogue.dC = stride_d;  // no source: unread
      args.epilogue.thread = {{scaled, {static_cast<const ElementOut*>(p.bias)}, {}}, {}};
    } else {
      args.epilogue.dC = stride_d;  // no source: unread
      args.epilogue.thread = {scaled, {static_cast<const ElementOut*>(p.bias)}, {}};
    }
    args.hw_info.sm_count = sm_count;
    args.scheduler.max_swizzle_size = gemm_sm90::swizzle(p.n, size<1>(TileShape{}));
    return args;
  }

  static int64_t workspace_bytes(const Fp8LinearParams& p, int sm_count) {
    return static_cast<int64_t>(Gemm::get_workspace_size(arguments(p, sm_count)));
  }

  static cudaError_t run(const Fp8LinearParams& p, int device, int sm_count, void* workspace, cudaStream_t stream) {
    return gemm_sm90::run<Gemm>(arguments(p, sm_count), device, workspace, stream);
  }
};

// f(Fp8Gemm<out dtype, form>{}) for p's output dtype and epilogue.
template <typename F>
auto dispatch(const Fp8LinearParams& p, F&& f) {
  const auto by_dtype = [&](auto form) {
    constexpr Form kForm = decltype(form)::value;
    return p.out_dtype == DType::kBFloat16 ? f(Fp8Gemm<cutlass::bfloat16_t, kForm>{})
                                           : f(Fp8Gemm<cutlass::half_t, kForm>{});
  };
  if (p.residual != nullptr) return by_dtype(std::integral_constant<Form, Form::kGatedResidual>{});
  if (p.activation == Fp8Activation::kGeluTanh) return by_dtype(std::integral_constant<Form, Form::kGeluTanh>{});
  return by_dtype(std::integral_constant<Form, Form::kPlain>{});
}

}  // namespace

int64_t workspace_bytes(const Fp8LinearParams& p) {
  if (cuda_support(p) != nullptr || p.m == 0 || p.n == 0) return 0;
  return dispatch(p, [&](auto gemm) { return gemm.workspace_bytes(p, gemm_sm90::current_device().sm_count); });
}

cudaError_t launch(const Fp8LinearParams& p, void* workspace, cudaStream_t stream) {
  if (validate(p) != nullptr || cuda_support(p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  const gemm_sm90::Device device = gemm_sm90::current_device();
  return dispatch(p, [&](auto gemm) { return gemm.run(p, device.index, device.sm_count, workspace, stream); });
}

}  // namespace ltx_kernels
