// The Autograd kernels of our ops.
//
// forward_only: ops without a backward. Without an Autograd kernel torch only warns and
// backward() leaves every parameter below the op with grad None: a patched model in train mode
// would silently train nothing but its head. This kernel raises instead, naming the op and the
// argument, whenever grad mode is on and a tensor argument requires grad; otherwise it runs the
// op's backend kernel unchanged.
//
// differentiable: ops with a backward op `<name>_backward(<gradients of the outputs>, <the op's
// own arguments>)` returning one gradient per tensor argument. Both are registered ops, so
// torch.compile traces them as they are and AOTAutograd partitions forward from backward; the
// backward recomputes what it needs from the inputs (e.g. a row's rstd) instead of saving it,
// unless an output serves it better: a backward op whose schema goes on after the op's
// arguments takes the outputs named there, and they are saved too (fused_linear_cross_entropy's
// row log-sum-exp, a pass of the head's GEMM; fused_add_rms_norm's new_residual, one tensor
// where its inputs were two). Arguments a backward does not need are left unsaved by
// save_only_when, and an argument whose gradient is another one (another argument's, an
// output's incoming gradient) gets that tensor by gradient_is (registration.h).
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

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

// The backward op of the op named `name`.
c10::OperatorHandle backward_of(const std::string& name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow((name + "_backward").c_str(), "");
}

// save_only_when(op, arguments, requiring_grad): the arguments of op saved for its backward only
// when one of requiring_grad requires grad (never when that is empty).
struct SaveRule {
  std::vector<std::string> arguments, requiring_grad;
};
std::map<std::string, SaveRule>& save_rules() {
  static std::map<std::string, SaveRule> rules;
  return rules;
}

// The ops with gradient_is rules: per argument position, the backward op's return slot of its
// gradient (-1 - k: output k's incoming gradient; unused for a non-tensor argument), computed
// when a rule is registered. An op without rules numbers its tensor arguments in order.
std::map<std::string, std::vector<int64_t>>& gradient_slots() {
  static std::map<std::string, std::vector<int64_t>> slots;
  return slots;
}

bool is_tensor_argument(const c10::Argument& argument) {
  return argument.type()->isSubtypeOf(*c10::OptionalType::ofTensor());  // Tensor(?)
}

// The index of `name` among the backward op's arguments that are the op's output gradients, or -1.
int64_t output_gradient_index(const c10::FunctionSchema& schema, const std::string& name) {
  const std::vector<c10::Argument>& backward_args = backward_of(schema.operator_name().name).schema().arguments();
  for (size_t k = 0; k < schema.returns().size(); ++k) {
    if (backward_args[k].name() == name) return static_cast<int64_t>(k);
  }
  return -1;
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// The op's call as a torch::autograd::Function. `tensors` are the tensor arguments given (an
// absent optional one is not a variable), `args` all the arguments with those tensors replaced
// by None (the tensors are saved as SavedVariables, which check that they are not modified in
// place before the backward, except those marked in `unsaved`: the backward gets None for
// them); tensor i is argument positions[i] and gets the backward op's return slots[i] (its
// ordinal among the schema's tensor arguments that have a gradient of their own; gradient_is:
// an argument with another's gradient takes its slot) or, for slots[i] = -1 - k, the incoming
// gradient of output k.
struct Differentiable : torch::autograd::Function<Differentiable> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const c10::OperatorHandle& op, at::TensorList tensors,
                                                std::vector<c10::IValue> args, std::vector<int64_t> positions,
                                                std::vector<int64_t> slots, std::vector<int64_t> unsaved) {
    torch::jit::Stack stack = args;
    for (size_t i = 0; i < tensors.size(); ++i) stack[positions[i]] = tensors[i];
    {
      const at::AutoDispatchBelowADInplaceOrView guard;
      op.callBoxed(stack);
    }
    torch::autograd::variable_list outputs;
    for (const c10::IValue& v : stack) outputs.push_back(v.toTensor());
    torch::autograd::variable_list saved = tensors.vec();
    for (size_t i = 0; i < saved.size(); ++i) {
      if (unsaved[i]) saved[i] = at::Tensor();
    }
    // The outputs the backward op takes after the op's arguments, by name.
    const std::vector<c10::Argument>& backward_args = backward_of(op.operator_name().name).schema().arguments();
    const std::vector<c10::Argument>& returns = op.schema().returns();
    for (size_t a = returns.size() + op.schema().arguments().size(); a < backward_args.size(); ++a) {
      size_t r = 0;
      while (r < returns.size() && returns[r].name() != backward_args[a].name()) ++r;
      TORCH_INTERNAL_ASSERT(r < returns.size(), backward_args[a].name(), " is not an output of ", op.schema().name());
      saved.push_back(outputs[r]);
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["inputs"] = static_cast<int64_t>(tensors.size());
    ctx->saved_data["op"] = op.operator_name().name;
    ctx->saved_data["args"] = c10::ivalue::Tuple::create(std::move(args));
    ctx->saved_data["positions"] = positions;
    ctx->saved_data["slots"] = slots;
    return outputs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const c10::OperatorHandle backward_op = backward_of(ctx->saved_data["op"].toStringRef());
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const size_t inputs = static_cast<size_t>(ctx->saved_data["inputs"].toInt());
    const std::vector<int64_t> positions = ctx->saved_data["positions"].toIntVector();
    const std::vector<int64_t> slots = ctx->saved_data["slots"].toIntVector();
    torch::jit::Stack stack(grads.begin(), grads.end());
    for (const c10::IValue& v : ctx->saved_data["args"].toTupleRef().elements()) stack.push_back(v);
    for (size_t i = 0; i < inputs; ++i) {
      if (saved[i].defined()) stack[grads.size() + positions[i]] = saved[i];  // else None
    }
    for (size_t i = inputs; i < saved.size(); ++i) stack.push_back(saved[i]);  // the outputs, if saved
    backward_op.callBoxed(stack);
    // One gradient per argument of forward: op, each tensor, args, positions, slots, unsaved.
    torch::autograd::variable_list out(inputs + 5);
    for (size_t i = 0; i < inputs; ++i) {
      out[1 + i] = slots[i] >= 0 ? stack.at(slots[i]).toTensor() : grads.at(-1 - slots[i]);
    }
    return out;
  }
};

void differentiable(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  if (!at::GradMode::is_enabled() || argument_requiring_grad(schema, torch::jit::last(*stack, num_args)) == nullptr) {
    const at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
    return;
  }
  std::vector<c10::IValue> args(stack->end() - num_args, stack->end());
  torch::jit::drop(*stack, num_args);
  // save_only_when: which arguments go unsaved in this call.
  const auto found = save_rules().find(schema.name());
  const SaveRule* rule = found == save_rules().end() ? nullptr : &found->second;
  bool save_all = rule == nullptr;
  for (size_t i = 0; i < num_args && !save_all; ++i) {
    save_all = contains(rule->requiring_grad, schema.arguments()[i].name()) && args[i].isTensor() &&
               args[i].toTensor().requires_grad();
  }
  const auto ruled = gradient_slots().find(schema.name());
  const std::vector<int64_t>* slot_at = ruled == gradient_slots().end() ? nullptr : &ruled->second;
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> positions, slots, unsaved;
  int64_t slot = 0;
  for (size_t i = 0; i < num_args; ++i) {
    if (!is_tensor_argument(schema.arguments()[i])) continue;
    if (args[i].isTensor()) {
      tensors.push_back(args[i].toTensor());
      positions.push_back(static_cast<int64_t>(i));
      slots.push_back(slot_at ? (*slot_at)[i] : slot);
      unsaved.push_back(!save_all && contains(rule->arguments, schema.arguments()[i].name()));
      args[i] = c10::IValue();
    }
    ++slot;
  }
  // A TensorList, not the vector: Function::apply finds the variables by argument type.
  for (at::Tensor& out : Differentiable::apply(op, at::TensorList(tensors), std::move(args), std::move(positions),
                                               std::move(slots), std::move(unsaved))) {
    stack->push_back(std::move(out));
  }
}

}  // namespace

torch::CppFunction forward_only_kernel() {
  return torch::CppFunction::makeFromBoxedFunction<&forward_only>();
}

torch::CppFunction differentiable_kernel() {
  return torch::CppFunction::makeFromBoxedFunction<&differentiable>();
}

void save_only_when(const std::string& op, std::vector<std::string> arguments,
                    std::vector<std::string> requiring_grad) {
  save_rules()[std::string(LTX_KERNELS_OPS_NAMESPACE_STR "::") + op] = {std::move(arguments),
                                                                        std::move(requiring_grad)};
}

void gradient_is(const std::string& op, const std::string& argument, const std::string& source) {
  const c10::FunctionSchema& schema =
      c10::Dispatcher::singleton().findSchemaOrThrow((LTX_KERNELS_OPS_NAMESPACE_STR "::" + op).c_str(), "").schema();
  const std::optional<int> at = schema.argumentIndexWithName(argument);
  TORCH_INTERNAL_ASSERT(at && is_tensor_argument(schema.arguments()[*at]), op, " has no tensor argument ", argument);
  const std::optional<int> from = schema.argumentIndexWithName(source);
  const int64_t output = from ? -1 : output_gradient_index(schema, source);
  TORCH_INTERNAL_ASSERT(from ? *from != *at && is_tensor_argument(schema.arguments()[*from]) : output >= 0, op, ": ",
                        source, " is neither another tensor argument nor an output gradient of ", op, "_backward");
  // The rules of the op so far (source >= 0: an argument position; -1 - k: output k), then
  // every argument's slot again: the others' slots close up around the ones that have none.
  static std::map<std::string, std::map<int, int64_t>> rules;
  std::map<int, int64_t>& op_rules = rules[schema.name()];
  op_rules[*at] = from ? *from : -1 - output;
  std::vector<int64_t> slot_at(schema.arguments().size(), 0);
  int64_t next = 0;
  for (size_t i = 0; i < slot_at.size(); ++i) {
    if (is_tensor_argument(schema.arguments()[i]) && !op_rules.count(static_cast<int>(i))) slot_at[i] = next++;
  }
  for (const auto& [i, s] : op_rules) {
    TORCH_INTERNAL_ASSERT(s < 0 || !op_rules.count(static_cast<int>(s)), op, ": a gradient_is source has a rule too");
    slot_at[i] = s >= 0 ? slot_at[s] : s;
  }
  gradient_slots()[schema.name()] = std::move(slot_at);
}

}  // namespace ltx_kernels::torch_ext
