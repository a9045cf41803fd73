// The FP8 linear on Hopper (include/ltx_kernels/fp8_linear.h): a CUTLASS 3 GEMM, sm_90a. TMA
// loads, warp-specialized (one producer warp, two consumer warpgroups sharing a 128 x 256
// tile), persistent over the output tiles, clusters of two CTAs along M sharing (multicasting)
// their B tiles. The row-wise scales and the bias are an epilogue visitor tree, applied to the
// fp32 accumulator before one rounding.
//
// Accumulation: the tensor cores' own FP8 accumulator over all of k ("fast accumulation").
// Promoting it to fp32 registers every k-block of 128 needs a second 64 x 256 fp32 accumulator
// per consumer thread (register spills at this tile), and the 128 x 128 tiles that fit it ran
// 800-1000 TFLOPS at the LTX shapes against 1140-1400 here (H100, measured when choosing). Its
// error (1.5e-3 of the rms at k = 3072, measured) is small beside e4m3's own 2.6e-2.
#include "ltx_kernels/fp8_linear.h"

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

template <typename ElementOut>
struct Fp8Gemm {
  using ElementAB = cutlass::float_e4m3_t;
  using TileShape = Shape<_128, _256, _128>;
  using ClusterShape = Shape<_2, _1, _1>;  // pairs of CTAs share (multicast) their B tiles
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;

  // out = (acc * a_scale[m]) * b_scale[n] + bias[n]: fp32, rounded once to ElementOut. A null
  // bias pointer reads as zeros.
  using AScale = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<_1, _0, _0>>;
  using BScale = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, _1, _0>>;
  using Bias = fusion::Sm90RowBroadcast<0, TileShape, ElementOut, float, Stride<_0, _1, _0>>;
  using Multiply = fusion::Sm90Compute<cutlass::multiplies, float, float, cutlass::FloatRoundStyle::round_to_nearest>;
  using AddBias = fusion::Sm90Compute<cutlass::plus, ElementOut, float, cutlass::FloatRoundStyle::round_to_nearest>;
  using Scaled = fusion::Sm90EVT<Multiply, fusion::Sm90EVT<Multiply, fusion::Sm90AccFetch, AScale>, BScale>;
  using Epilogue = fusion::Sm90EVT<AddBias, Scaled, Bias>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor,
      16 / sizeof(ElementOut), ElementOut, cutlass::layout::RowMajor, 16 / sizeof(ElementOut), EpilogueSchedule,
      Epilogue>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cutlass::layout::RowMajor, 16, ElementAB,
      cutlass::layout::ColumnMajor, 16, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const Fp8LinearParams& p, int sm_count) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideD = typename Kernel::StrideD;
    const int m = static_cast<int>(p.m), n = static_cast<int>(p.n), k = static_cast<int>(p.k);
    StrideA stride_a = make_stride(p.a_row_stride, _1{}, int64_t(0));
    StrideB stride_b = make_stride(p.b_row_stride, _1{}, int64_t(0));  // [n, k]: B column-major
    StrideD stride_d = make_stride(p.out_row_stride, _1{}, int64_t(0));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {m, n, k, 1},
        {reinterpret_cast<const ElementAB*>(p.a), stride_a, reinterpret_cast<const ElementAB*>(p.b), stride_b},
        {{}, nullptr, stride_d, static_cast<ElementOut*>(p.out), stride_d},
    };
    // The tree's arguments nest as its nodes: {children..., the node's own}.
    args.epilogue.thread = {
        {{{}, {p.a_scale}, {}}, {p.b_scale}, {}},
        {static_cast<const ElementOut*>(p.bias)},
        {},
    };
    args.hw_info.sm_count = sm_count;
    return args;
  }

  static int64_t workspace_bytes(const Fp8LinearParams& p, int sm_count) {
    return static_cast<int64_t>(Gemm::get_workspace_size(arguments(p, sm_count)));
  }

  static cudaError_t run(const Fp8LinearParams& p, int sm_count, void* workspace, cudaStream_t stream) {
    Gemm gemm;
    const auto args = arguments(p, sm_count);
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
    const cutlass::Status status = gemm.run(stream);
    const cudaError_t error = cudaGetLastError();
    if (status == cutlass::Status::kSuccess || error != cudaSuccess) return error;
    return cudaErrorLaunchFailure;
  }
};

// SMs of the current device: the persistent grid's size (an attribute query, cheap per launch).
int sm_count() {
  int device = 0, count = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
  return count;
}

template <typename F>
auto dispatch_out(DType dtype, F&& f) {
  return dtype == DType::kBFloat16 ? f(Fp8Gemm<cutlass::bfloat16_t>{}) : f(Fp8Gemm<cutlass::half_t>{});
}

}  // namespace

int64_t workspace_bytes(const Fp8LinearParams& p) {
  if (cuda_support(p) != nullptr || p.m == 0 || p.n == 0) return 0;
  return dispatch_out(p.out_dtype, [&](auto gemm) { return gemm.workspace_bytes(p, sm_count()); });
}

cudaError_t launch(const Fp8LinearParams& p, void* workspace, cudaStream_t stream) {
  if (validate(p) != nullptr || cuda_support(p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  return dispatch_out(p.out_dtype, [&](auto gemm) { return gemm.run(p, sm_count(), workspace, stream); });
}

}  // namespace ltx_kernels
