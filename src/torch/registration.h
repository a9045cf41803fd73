// The torch.ops namespace the ops register under.
//
// "ltx_kernels" for the pip package. A HuggingFace Kernels Hub export compiles with a
// build-unique LTX_KERNELS_OPS_NAMESPACE (e.g. _ltx_kernels_3f2a...), so several builds can be
// loaded into one process side by side. TORCH_LIBRARY pastes its namespace argument into
// identifiers, which stops a macro argument from expanding: the *_EXPAND indirection expands it
// first.
#pragma once

#include <torch/library.h>

#ifndef LTX_KERNELS_OPS_NAMESPACE
#define LTX_KERNELS_OPS_NAMESPACE ltx_kernels
#endif

#define LTX_KERNELS_TORCH_LIBRARY_EXPAND(ns, m) TORCH_LIBRARY(ns, m)
#define LTX_KERNELS_TORCH_LIBRARY_IMPL_EXPAND(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)

// TORCH_LIBRARY(<namespace>, m) / TORCH_LIBRARY_IMPL(<namespace>, key, m) for our namespace.
#define LTX_KERNELS_LIBRARY(m) LTX_KERNELS_TORCH_LIBRARY_EXPAND(LTX_KERNELS_OPS_NAMESPACE, m)
#define LTX_KERNELS_LIBRARY_IMPL(k, m) LTX_KERNELS_TORCH_LIBRARY_IMPL_EXPAND(LTX_KERNELS_OPS_NAMESPACE, k, m)

// The namespace as a string, e.g. for an op's qualified name: "ltx_kernels".
#define LTX_KERNELS_STRINGIFY(x) #x
#define LTX_KERNELS_STRINGIFY_EXPAND(x) LTX_KERNELS_STRINGIFY(x)
#define LTX_KERNELS_OPS_NAMESPACE_STR LTX_KERNELS_STRINGIFY_EXPAND(LTX_KERNELS_OPS_NAMESPACE)

namespace ltx_kernels::torch_ext {
// The Autograd kernel of an op without a backward (autograd.cpp): raises when an input
// requires grad in grad mode, so gradients are never silently None.
torch::CppFunction forward_only_kernel();
// The Autograd kernel of an op `<name>` with a registered `<name>_backward` (autograd.cpp).
torch::CppFunction differentiable_kernel();
}  // namespace ltx_kernels::torch_ext
