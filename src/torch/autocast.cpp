// The Autocast kernels of our GEMM ops (linear_gelu_tanh, fused_linear_cross_entropy): under
// torch.autocast they run in the autocast dtype, as torch's own linear does. Without them the
// autocast keys fall through and the ops see what mixed-precision training hands them, fp32
// master weights (and an fp32 residual stream), so their GEMMs ran in fp32: several times
// slower than the stock model's under the same autocast, and not what the user asked for.
// Each floating tensor argument is cast as torch's lower-precision ops do (cached_cast: the
// weights once per autocast region; differentiable, so gradients reach the fp32 leaves), then
// the op runs with autocast excluded.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include "torch/registration.h"

namespace ltx_kernels::torch_ext {
namespace {

template <c10::DeviceType kDevice>
void lower_precision(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const c10::ScalarType dtype = at::autocast::get_autocast_dtype(kDevice);
  const size_t num_args = op.schema().arguments().size();
  for (size_t i = stack->size() - num_args; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) v = at::autocast::cached_cast(dtype, v.toTensor(), kDevice);
  }
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  op.callBoxed(stack);
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(AutocastCUDA, m) {
  for (const char* name : {"linear_gelu_tanh", "fused_linear_cross_entropy"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&lower_precision<c10::DeviceType::CUDA>>());
  }
}

LTX_KERNELS_LIBRARY_IMPL(AutocastCPU, m) {
  for (const char* name : {"linear_gelu_tanh", "fused_linear_cross_entropy"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&lower_precision<c10::DeviceType::CPU>>());
  }
}

}  // namespace ltx_kernels::torch_ext
