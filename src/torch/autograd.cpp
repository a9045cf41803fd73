// The Autograd kernel of ops that have no backward yet.
//
// Without an Autograd kernel torch only warns and backward() leaves every parameter below the
// op with grad None: a patched model in train mode would silently train nothing but its head.
// This kernel raises instead, naming the op and the argument, whenever grad mode is on and a
// tensor argument requires grad; otherwise it runs the op's backend kernel unchanged.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>

#include "torch/registration.h"

namespace ltx_kernels::torch_ext {
namespace {

// The first tensor argument (or element of a tensor list) that requires grad, or nullptr.
const char* argument_requiring_grad(const c10::FunctionSchema& schema,
                                    c10::ArrayRef<c10::IValue> args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = args[i];
    bool requires_grad = v.isTensor() && v.toTensor().requires_grad();
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList().vec()) requires_grad |= t.requires_grad();
    }
    if (requires_grad) return schema.arguments()[i].name().c_str();
  }
  return nullptr;
}

void forward_only(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                  torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  if (at::GradMode::is_enabled()) {
    const char* name = argument_requiring_grad(schema, torch::jit::last(*stack, num_args));
    TORCH_CHECK(name == nullptr, schema.operator_name(), ": `", name,
                "` requires grad, but this op has no backward yet, so gradients would be lost. "
                "Run inference under torch.no_grad() or torch.inference_mode(), or train with the "
                "stock modules (ltx_kernels.diffusers.remove / ltx_kernels.transformers.remove).");
  }
  // Arguments the op writes (out=, in-place) get their version counter bumped, as torch's own
  // in-place ops do, so autograd notices a later use of a stale value.
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < num_args; ++i) {
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    const c10::IValue& v = (*stack)[stack->size() - num_args + i];
    if (alias && alias->isWrite() && v.isTensor()) written.push_back(v.toTensor());
  }
  {
    const at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  for (const at::Tensor& t : written) {
    if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
  }
}

}  // namespace

torch::CppFunction forward_only_kernel() {
  return torch::CppFunction::makeFromBoxedFunction<&forward_only>();
}

}  // namespace ltx_kernels::torch_ext
