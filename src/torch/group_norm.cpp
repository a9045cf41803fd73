// torch bindings of group_norm (include/ltx_kernels/group_norm.h): a UNet's GroupNorm, with
// the SiLU after it and a ResNet block's time-embedding add before it fused in, and its
// backward. CPU (the reference), CUDA and Meta.
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "ltx_kernels/group_norm.h"
#include "torch/backward.h"
#include "torch/common.h"
#include "torch/registration.h"

namespace ltx_kernels::torch_ext {
namespace {

constexpr const char* kOp = "group_norm";

// weight or bias: [C], x's dtype or float32, on x's device.
void check_channels(const OptTensor& t, const char* name, const at::Tensor& x) {
  if (!t) return;
  TORCH_CHECK_TYPE(t->scalar_type() == x.scalar_type() || t->scalar_type() == at::kFloat, kOp, ": ", name,
                   " must have the dtype of x (", x.scalar_type(), ") or float32, got ", t->scalar_type());
  TORCH_CHECK_VALUE(t->device() == x.device(), kOp, ": ", name, " must be on the device of x (",
                    device_str(x.device()), "), got ", device_str(t->device()));
  TORCH_CHECK_VALUE(t->dim() == 1 && t->sym_size(0) == x.sym_size(1), kOp, ": ", name,
                    " must have shape [C] (x's dim 1: ", dims_str(x.sym_sizes().slice(1, 1)), "), got ",
                    dims_str(t->sym_sizes()));
}

// Every argument of the forward (and of the backward, which takes the same ones).
void check_args(const at::Tensor& x, int64_t num_groups, const OptTensor& weight, const OptTensor& bias, double eps,
                const OptTensor& add) {
  const auto type = x.scalar_type();
  TORCH_CHECK_TYPE(type == at::kFloat || type == at::kHalf || type == at::kBFloat16, kOp,
                   ": x must be float32, float16 or bfloat16, got ", type);
  TORCH_CHECK_VALUE(x.device().is_cpu() || x.device().is_cuda() || x.device().is_meta(), kOp,
                    ": x must be on a CPU or CUDA device, got ", device_str(x.device()));
  TORCH_CHECK_VALUE(x.dim() >= 2, kOp, ": x must be [N, C, *] (at least 2 dims), got ", dims_str(x.sym_sizes()));
  TORCH_CHECK_VALUE(num_groups >= 1, kOp, ": num_groups must be >= 1, got ", std::to_string(num_groups));
  TORCH_CHECK_VALUE(x.sym_size(1) % num_groups == 0, kOp, ": num_groups (", std::to_string(num_groups),
                    ") must divide x's channels (dim 1 of ", dims_str(x.sym_sizes()), ")");
  TORCH_CHECK_VALUE(eps >= 0.0, kOp, ": eps must be >= 0, got ", std::to_string(eps));
  check_channels(weight, "weight", x);
  check_channels(bias, "bias", x);
  if (weight && bias) {
    TORCH_CHECK_TYPE(weight->scalar_type() == bias->scalar_type(), kOp, ": weight and bias must have one dtype, got ",
                     weight->scalar_type(), " and ", bias->scalar_type());
  }
  if (add) {
    TORCH_CHECK_TYPE(add->scalar_type() == type, kOp, ": add must have the dtype of x (", type, "), got ",
                     add->scalar_type());
    TORCH_CHECK_VALUE(add->device() == x.device(), kOp, ": add must be on the device of x (",
                      device_str(x.device()), "), got ", device_str(add->device()));
    TORCH_CHECK_VALUE(add->dim() == 2 && add->sym_size(0) == x.sym_size(0) && add->sym_size(1) == x.sym_size(1), kOp,
                      ": add must have shape [N, C] (x's first two dims: ", dims_str(x.sym_sizes().slice(0, 2)),
                      "), got ", dims_str(add->sym_sizes()));
  }
}

// Whether x is laid out channels last: [N, *, C] contiguous in memory (NHWC for 4 dims).
// A tensor contiguous both ways (size-1 dims) counts as channels first.
bool is_channels_last(const at::Tensor& x) {
  return !x.is_contiguous() && x.movedim(1, -1).is_contiguous();
}

// An empty output of x's shape in the layout the kernels write: channels last or first.
at::Tensor empty_out(const at::Tensor& x, bool channels_last) {
  if (!channels_last) return at::empty_symint(x.sym_sizes(), x.options());
  return at::empty_symint(x.movedim(1, -1).sym_sizes(), x.options()).movedim(-1, 1);
}

at::Tensor group_norm_meta(const at::Tensor& x, int64_t num_groups, const OptTensor& weight, const OptTensor& bias,
                           double eps, const OptTensor& add, bool silu) {
  check_args(x, num_groups, weight, bias, eps, add);
  return empty_out(x, is_channels_last(x));
}

// x in either layout as it is (another layout is copied to channels first), weight and bias
// in one dtype.
at::Tensor group_norm(const at::Tensor& x_in, int64_t num_groups, const OptTensor& weight_in,
                      const OptTensor& bias_in, double eps, const OptTensor& add_in, bool silu) {
  check_args(x_in, num_groups, weight_in, bias_in, eps, add_in);
  const bool channels_last = is_channels_last(x_in);
  const at::Tensor x = channels_last ? x_in : x_in.contiguous();
  at::Tensor out = empty_out(x, channels_last);
  if (x.numel() == 0) return out;
  // (either one float32 makes both float32: the kernels read them in one dtype)
  const bool fp32_params = (weight_in && weight_in->scalar_type() == at::kFloat) ||
                           (bias_in && bias_in->scalar_type() == at::kFloat);
  const auto param = [&](const OptTensor& t) -> OptTensor {
    if (!t) return std::nullopt;
    return fp32_params ? t->to(at::kFloat).contiguous() : t->contiguous();
  };
  const OptTensor weight = param(weight_in), bias = param(bias_in);
  const OptTensor add = add_in ? OptTensor(add_in->contiguous()) : std::nullopt;
  GroupNormParams p;
  p.dtype = to_dtype(x.scalar_type());
  p.weight_dtype = fp32_params ? DType::kFloat32 : p.dtype;
  p.batch = x.size(0);
  p.channels = x.size(1);
  p.spatial = x.numel() / (p.batch * p.channels);
  p.groups = num_groups;
  p.channels_last = channels_last;
  p.eps = static_cast<float>(eps);
  p.silu = silu;
  p.x = x.const_data_ptr();
  p.add = data_or_null(add);
  p.weight = data_or_null(weight);
  p.bias = data_or_null(bias);
  p.out = out.mutable_data_ptr();
  check_core(p, kOp);
  if (x.device().is_cpu()) {
    reference(p);
    return out;
  }
#ifdef LTX_KERNELS_WITH_CUDA
  if (x.scalar_type() == at::kBFloat16) {
    check_compute_capability(x, 80, kOp, "has no bfloat16 arithmetic (Ampere and newer have it): use float16 or float32");
  }
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor workspace = at::empty({workspace_floats(p)}, x.options().dtype(at::kFloat));
  const cudaError_t error = launch(p, workspace.mutable_data_ptr<float>(),
                                   c10::cuda::getCurrentCUDAStream(x.device().index()));
  TORCH_CHECK(error == cudaSuccess, kOp, ": CUDA launch failed: ", cudaGetErrorString(error));
#else
  TORCH_CHECK(false, kOp, ": ltx_kernels was built without CUDA support; got a non-CPU tensor");
#endif
  return out;
}

using Grads4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

void check_backward(const at::Tensor& grad_out, const at::Tensor& x, int64_t num_groups, const OptTensor& weight,
                    const OptTensor& bias, double eps, const OptTensor& add) {
  check_args(x, num_groups, weight, bias, eps, add);
  check_grad(grad_out, "group_norm_backward: grad_out", x, x.scalar_type());
}

Grads4 group_norm_backward_meta(const at::Tensor& grad_out, const at::Tensor& x, int64_t num_groups,
                                const OptTensor& weight, const OptTensor& bias, double eps, const OptTensor& add,
                                bool silu) {
  check_backward(grad_out, x, num_groups, weight, bias, eps, add);
  const auto like = [&](const OptTensor& t) { return t ? meta_grad(*t) : none_grad(x); };
  return {meta_grad(x), like(weight), like(bias), like(add)};
}

// group_norm's backward on any device, in fp32: h = x + add (as the forward adds it), torch's own
// fused GroupNorm forward of h (the statistics and z = x_hat * w + b, recomputed: nothing is
// saved), dz = silu'(z) * grad (or grad), torch's fused GroupNorm backward for dx, dweight and
// dbias, and dadd = dx summed over the positions. Six passes over the tensor instead of the
// ~25 of an elementwise composition; a kernel of our own in the forward's style is not written
// yet.
Grads4 group_norm_backward(const at::Tensor& grad_out, const at::Tensor& x, int64_t num_groups,
                           const OptTensor& weight, const OptTensor& bias, double eps, const OptTensor& add,
                           bool silu) {
  check_backward(grad_out, x, num_groups, weight, bias, eps, add);
  const int64_t n = x.size(0), c = x.size(1);
  if (x.numel() == 0) {  // no element: every gradient 0 (and no group to reshape into)
    const auto zero = [&](const OptTensor& t) { return t ? at::zeros_like(*t) : none_grad(x); };
    return {at::zeros_like(x), zero(weight), zero(bias), zero(add)};
  }
  const int64_t positions = x.numel() / (n * c);
  at::Tensor h = grad_as(x, at::kFloat).view({n, c, positions});  // (fp32, contiguous)
  if (add) h = h + f32(*add).view({n, c, 1});
  // (ones for an absent weight: torch's backward sizes dbias from the weight)
  const at::Tensor w = weight ? f32(*weight) : at::ones({c}, h.options());
  const OptTensor b = bias ? OptTensor(f32(*bias)) : std::nullopt;
  const auto [z, mean, rstd] = at::native_group_norm(h, w, b, n, c, positions, num_groups, eps);
  const at::Tensor g = grad_as(grad_out, at::kFloat).view({n, c, positions});
  const at::Tensor dz = silu ? at::silu_backward(g, z) : g;
  const auto [dh, dw, db] = at::native_group_norm_backward(dz, h, mean, rstd, w, n, c, positions, num_groups,
                                                           {true, weight.has_value(), bias.has_value()});
  const at::Tensor dadd = add ? dh.sum(-1) : at::Tensor();  // (a fresh tensor, not dh itself)
  return {grad_as(dh.view(x.sizes()), x.scalar_type()), weight ? grad_as(dw, weight->scalar_type()) : none_grad(x),
          bias ? grad_as(db, bias->scalar_type()) : none_grad(x), add ? grad_as(dadd, add->scalar_type()) : none_grad(x)};
}

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CPU, m) {
  LTX_KERNELS_IMPL(m, "group_norm", group_norm);
  LTX_KERNELS_IMPL(m, "group_norm_backward", group_norm_backward);
}
LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  LTX_KERNELS_IMPL(m, "group_norm", group_norm_meta);
  LTX_KERNELS_IMPL(m, "group_norm_backward", group_norm_backward_meta);
}
#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) {
  LTX_KERNELS_IMPL(m, "group_norm", group_norm);
  LTX_KERNELS_IMPL(m, "group_norm_backward", group_norm_backward);
}
#endif

}  // namespace ltx_kernels::torch_ext
