// linear_gated_residual on Hopper (include/ltx_kernels/linear_gated_residual.h): a CUTLASS 3
// GEMM of 16-bit operands, sm_90a, with the FP8 linear's gated-residual epilogue
// (fp8_linear_sm90.cu) minus its scales: TMA loads, warp-specialized consumers (ping-pong or
// cooperative, below), persistent over the tiles, clusters of two CTAs. The batched form: m /
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

// Two configurations, measured against cuBLAS + gated_residual on an H200 (batched as the DiT
// blocks call it: benchmarks/results/h200/linear_gated_residual.md):
// - ping-pong, 128 x 128 tiles, 1 x 2 clusters (the FP8 kernel's): its epilogue, which reads
//   the residual, overlaps the other warpgroup's mainloop; best where k is short (2 x 8064 x
//   2048 -> 2048: 187 us against cuBLAS + gated_residual's 238; the 128 x 256 tile 202);
// - cooperative, 128 x 256 tiles, 2 x 1 clusters (both warpgroups on one tile, twice the
//   arithmetic per byte of shared memory): the faster mainloop from k = 4096 on, where there are
//   >= 4 waves of its tiles (2 x 8064 x 8192 -> 2048: 705 us against 749 ping-pong and 787 for
//   the unfused pair; 2 x 6144 x 16384 -> 4096: 2392 / 2522 / 2403); with fewer waves, its
//   last wave's idle SMs cost more than it saves (333 x 5120 -> 1536: 56 vs 33 us).
struct PingPong {
  using TileShape = Shape<_128, _128, _64>;  // k tile: 128 bytes of 16-bit values
  using ClusterShape = Shape<_1, _2, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
};
struct Cooperative {
  using TileShape = Shape<_128, _256, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
};

bool cooperative_pays(const LinearGatedResidualParams& p, int sm_count) {
  const int64_t tiles = p.m / p.batch_rows * host_util::ceil_div(p.batch_rows, 128) * host_util::ceil_div(p.n, 256);
  return p.k >= 4096 && tiles >= 4 * static_cast<int64_t>(sm_count);
}

template <typename Element, typename Config>
struct GatedGemm {
  using TileShape = typename Config::TileShape;
  using ClusterShape = typename Config::ClusterShape;
  using KernelSchedule = typename Config::KernelSchedule;
  using EpilogueSchedule = typename Config::EpilogueSchedule;
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
// f(GatedGemm<element type, configuration>{}) for p's dtype and shape.
template <typename F>
auto dispatch(const LinearGatedResidualParams& p, int sm_count, F&& f) {
  const auto by_config = [&](auto element) {
    using Element = decltype(element);
    return cooperative_pays(p, sm_count) ? f(GatedGemm<Element, Cooperative>{}) : f(GatedGemm<Element, PingPong>{});
  };
  return p.dtype == DType::kBFloat16 ? by_config(cutlass::bfloat16_t{}) : by_config(cutlass::half_t{});
}

}  // namespace

int64_t workspace_bytes(const LinearGatedResidualParams& p) {
  if (cuda_support(p) != nullptr || p.m == 0 || p.n == 0) return 0;
  const int sm_count = gemm_sm90::current_device().sm_count;
  return dispatch(p, sm_count, [&](auto gemm) {
    using Gemm = typename decltype(gemm)::Gemm;
    return static_cast<int64_t>(Gemm::get_workspace_size(gemm.arguments(p, sm_count)));
  });
}

cudaError_t launch(const LinearGatedResidualParams& p, void* workspace, cudaStream_t stream) {
  if (validate(p) != nullptr || cuda_support(p) != nullptr) return cudaErrorInvalidValue;
  if (p.m == 0 || p.n == 0) return cudaSuccess;
  const gemm_sm90::Device device = gemm_sm90::current_device();
  return dispatch(p, device.sm_count, [&](auto gemm) {
    using Gemm = typename decltype(gemm)::Gemm;
    return gemm_sm90::run<Gemm>(gemm.arguments(p, device.sm_count), device.index, workspace, stream);
  });
}

}  // namespace ltx_kernels
