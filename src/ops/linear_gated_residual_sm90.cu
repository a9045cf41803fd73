// linear_gated_residual on Hopper (include/ltx_kernels/linear_gated_residual.h): a CUTLASS 3
// GEMM of 16-bit operands, sm_90a, with the FP8 linear's gated-residual epilogue
// (fp8_linear_sm90.cu) minus its scales: TMA loads, warp-specialized ping-pong (two consumer
// warpgroups that each own a 128 x 128 output tile and take turns at the tensor cores, so that
// one's epilogue, which reads the residual, runs while the other's mainloop does), persistent
// over the tiles, clusters of two CTAs along N sharing their A tiles. The batched form: m /
// batch_rows batches of batch_rows rows, the weight shared by all (a static zero batch stride,
// which TMA drops), so that the gate is a row broadcast per batch; the residual is the
// epilogue's source C.
#include "ltx_kernels/linear_gated_residual.h"
#include "ops/gemm_sm90.cuh"

#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

namespace ltx_kernels {
namespace {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

template <typename Element>
struct GatedGemm {
  using TileShape = Shape<_128, _128, _64>;  // k tile: 128 bytes of 16-bit values
  using ClusterShape = Shape<_1, _2, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  static constexpr int kAlignment = 16 / sizeof(Element);

  // out = residual + gate * (acc + bias): fp32, rounded once (a null bias reads as zeros, a
  // null gate as ones).
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Bias = fusion::Sm90RowBroadcast<0, TileShape, Element, float, Stride<_0, _1, _0>>;
  using Gate = fusion::Sm90RowBroadcast<0, TileShape, Element, float, Stride<_0, _1, int64_t>>;
  using Biased = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, float, float, kRound>, fusion::Sm90AccFetch, Bias>;
  using Gated = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::homogeneous_multiply_add, Element, float, kRound>,  // gate * y + residual
      Gate, Biased, fusion::Sm90SrcFetch<Element>>;
  // [n, k] weight: column-major B, the batch stride a static zero.
  using LayoutB = Stride<int64_t, _1, _0>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, Element, cutlass::layout::RowMajor, kAlignment,
      Element, cutlass::layout::RowMajor, kAlignment, EpilogueSchedule, Gated>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::RowMajor, kAlignment, Element,
      LayoutB, kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                      CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments arguments(const LinearGatedResidualParams& p, int sm_count) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    const int64_t rows = p.batch_rows;
    const int batches = static_cast<int>(p.m / rows);
    const auto batch_stride = [rows](int64_t row_stride) { return rows * row_stride; };
    StrideA stride_a = make_stride(p.a_row_stride, _1{}, batch_stride(p.a_row_stride));
    StrideB stride_b{};
    get<0>(stride_b) = p.b_row_stride;
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {static_cast<int>(rows), static_cast<int>(p.n), static_cast<int>(p.k), batches},
        {static_cast<const Element*>(p.a), stride_a, static_cast<const Element*>(p.b), stride_b},
        {},
    };
    args.epilogue.ptr_C = static_cast<const Element*>(p.residual);
    args.epilogue.dC = StrideC(make_stride(p.residual_row_stride, _1{}, batch_stride(p.residual_row_stride)));
    args.epilogue.ptr_D = static_cast<Element*>(p.out);
    args.epilogue.dD = StrideD(make_stride(p.out_row_stride, _1{}, batch_stride(p.out_row_stride)));
    // The tree's arguments nest as its nodes: {children..., the node's own}.
    args.epilogue.thread = {
        // (no gate: a null row pointer reads as the broadcast of this default, ones)
        {static_cast<const Element*>(p.gate), Element(1), {_0{}, _1{}, p.gate_batch_stride}},
        {{}, {static_cast<const Element*>(p.bias)}, {}},
        {},
        {},
    };
    args.hw_info.sm_count = sm_count;
    args.scheduler.max_swizzle_size = gemm_sm90::swizzle(p.n, size<1>(TileShape{}));
    return args;
  }
};

// f(GatedGemm<element type>{}) for p's dtype.
template <typename F>
auto dispatch(const LinearGatedResidualParams& p, F&& f) {
  return p.dtype == DType::kBFloat16 ? f(GatedGemm<cutlass::bfloat16_t>{}) : f(GatedGemm<cutlass::half_t>{});
}

}  // namespace

int64_t workspace_bytes(const LinearGatedResidualParams& p) {
  if (cuda_support(p) != nullptr || p.m == 0 || p.n == 0) return 0;
  return dispatch(p, [&](auto gemm) {
    using Gemm = typename decltype(gemm)::Gemm;
    return static_cast<int64_t>(Gemm::get_workspace_size(gemm.arguments(p, gemm_sm90::current_device().sm_count)));
  });
}

cudaError_t launch(const LinearGatedResidualParams& p, void* workspace, cudaStream_t stream) {
  if (validate(p) != nullptr || cuda_support(p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  const gemm_sm90::Device device = gemm_sm90::current_device();
  return dispatch(p, [&](auto gemm) {
    using Gemm = typename decltype(gemm)::Gemm;
    return gemm_sm90::run<Gemm>(gemm.arguments(p, device.sm_count), device.index, workspace, stream);
  });
}

}  // namespace ltx_kernels
