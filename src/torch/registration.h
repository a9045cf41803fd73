// The torch.ops namespace the ops register under.
//
// "ltx_kernels" for the pip package. A HuggingFace Kernels Hub export compiles with a
// build-unique LTX_KERNELS_OPS_NAMESPACE (e.g. _ltx_kernels_3f2a...), so several builds can be
// loaded into one process side by side. TORCH_LIBRARY pastes its namespace argument into
// identifiers, which stops a macro argument from expanding: the *_EXPAND indirection expands it
// first.
#pragma once

#include <torch/library.h>

#include <string>
#include <vector>

#ifndef LTX_KERNELS_OPS_NAMESPACE
#define LTX_KERNELS_OPS_NAMESPACE ltx_kernels
#endif

#define LTX_KERNELS_TORCH_LIBRARY_EXPAND(ns, m) TORCH_LIBRARY(ns, m)
#define LTX_KERNELS_TORCH_LIBRARY_IMPL_EXPAND(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

// TORCH_LIBRARY(<namespace>, m) / TORCH_LIBRARY_IMPL(<namespace>, key, m) for our namespace.
#define LTX_KERNELS_LIBRARY(m) LTX_KERNELS_TORCH_LIBRARY_EXPAND(LTX_KERNELS_OPS_NAMESPACE, m)
#define LTX_KERNELS_LIBRARY_IMPL(k, m) LTX_KERNELS_TORCH_LIBRARY_IMPL_EXPAND(LTX_KERNELS_OPS_NAMESPACE, k, m)

// m.impl(name, fn) behind NamedKernel (below): the kernel's errors name the op.
#define LTX_KERNELS_IMPL(m, name, fn)                                                         \
  do {                                                                                        \
    struct Tag {                                                                              \
      static const char* op() { return name; }                                                \
    };                                                                                        \
    (m).impl(name, &::ltx_kernels::torch_ext::NamedKernel<decltype(fn), &fn, Tag>::call);     \
  } while (false)

// The namespace as a string, e.g. for an op's qualified name: "ltx_kernels".
#define LTX_KERNELS_STRINGIFY(x) #x
#define LTX_KERNELS_STRINGIFY_EXPAND(x) LTX_KERNELS_STRINGIFY(x)
#define LTX_KERNELS_OPS_NAMESPACE_STR LTX_KERNELS_STRINGIFY_EXPAND(LTX_KERNELS_OPS_NAMESPACE)

namespace ltx_kernels::torch_ext {
// Errors name their op: `LTX_KERNELS_IMPL(m, "rms_norm", rms_norm)` registers rms_norm behind
// a wrapper that raises a c10 error of the kernel's (a shared check's, e.g. "weight must have
// shape [64] ...") again as "rms_norm: weight must have shape [64] ...", the same Python
// exception type; a message already naming the op passes as it is. The wrapper costs nothing
// where nothing is thrown. (The macro's local Tag type keeps one name per registration: one
// function may serve several ops, e.g. the Meta kernels of the GLU family.)
[[noreturn]] void rethrow_naming(const c10::Error& error, const char* op);

template <typename Fn, Fn* F, typename Tag>
struct NamedKernel;

template <typename R, typename... Args, R (*F)(Args...), typename Tag>
struct NamedKernel<R(Args...), F, Tag> {
  static R call(Args... args) {
    try {
      return F(std::forward<Args>(args)...);
    } catch (const c10::Error& error) {
      rethrow_naming(error, Tag::op());
    }
  }
};

// The Autograd kernel of an op without a backward (autograd.cpp): raises when an input
// requires grad in grad mode, so gradients are never silently None.
torch::CppFunction forward_only_kernel();
// The Autograd kernel of an op `<name>` with a registered `<name>_backward` (autograd.cpp).
torch::CppFunction differentiable_kernel();
// For an op with a differentiable_kernel: its tensor `arguments` are saved for the backward only
// when one of `requiring_grad` requires grad (never when that is empty); otherwise the backward
// op gets None for them (its schema declares them optional). The RoPE forms are linear in q and
// k, read only for the tables' gradients; fused_add_rms_norm's backward reads its output
// new_residual instead of x and residual.
void save_only_when(const std::string& op, std::vector<std::string> arguments,
                    std::vector<std::string> requiring_grad);
// For an op with a differentiable_kernel: its tensor `argument`'s gradient is always `source`,
// either another tensor argument's gradient (fused_add_rms_norm's residual has x's: both are
// summed into the one tensor it normalizes) or an output's incoming gradient, unchanged, by the
// backward op's name for it (gated_residual's x has grad_out). The backward op returns no
// gradient for `argument` and autograd hands it that tensor: a registered op's outputs may not
// alias one another or its inputs, so returning it would mean writing a copy.
void gradient_is(const std::string& op, const std::string& argument, const std::string& source);
}  // namespace ltx_kernels::torch_ext
