#include "torch/common.h"
#include "torch/registration.h"

#include <ATen/MemoryOverlap.h>

#ifdef LTX_KERNELS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace ltx_kernels::torch_ext {

// Messages format numbers, sizes and devices with std::to_string rather than through
// std::ostream (which c10::str and TORCH_CHECK use): streaming a number or a SymInt from
// this library crashed (SIGSEGV) when it was built with a newer GCC than torch's (seen with
// GCC 13 against the torch 2.11 wheel); streaming strings works.
std::string dims_str(c10::SymIntArrayRef dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ", ";
    const std::optional<int64_t> v = dims[i].maybe_as_int();
    s += v ? std::to_string(*v) : "symbolic";
  }
  return s + "]";
}

namespace {

std::string dim_str(const c10::SymInt& dim) { return dims_str(c10::SymIntArrayRef(&dim, 1)); }

}  // namespace

std::string device_str(const at::Device& device) {
  std::string s = device.is_cuda() ? "cuda" : device.is_cpu() ? "cpu" : device.is_meta() ? "meta" : "other";
  return device.has_index() ? s + ":" + std::to_string(device.index()) : s;
}

DType to_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: TORCH_CHECK_TYPE(false, "unsupported dtype ", type);
  }
}

namespace {

// The kernels read every tensor as rows whose elements are adjacent.
void check_last_dim_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.sym_size(-1) <= 1 || t.sym_stride(-1) == 1, name,
                    " must have a contiguous last dim (stride 1), got strides ", dims_str(t.sym_strides()),
                    "; call .contiguous() if this layout is intended");
}

// [first, last] byte addresses of a non-empty tensor's elements (torch strides are >= 0).
std::pair<uintptr_t, uintptr_t> byte_span(const at::Tensor& t) {
  const auto first = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return {first, first + static_cast<uintptr_t>((last + 1) * t.element_size()) - 1};
}

}  // namespace

void check_activation(const at::Tensor& x, const char* name) {
  const auto type = x.scalar_type();
  TORCH_CHECK_TYPE(type == at::kFloat || type == at::kHalf || type == at::kBFloat16, name,
              " must be float32, float16 or bfloat16, got ", type);
  TORCH_CHECK_VALUE(x.dim() >= 1, name, " must have at least 1 dim, got a 0-dim tensor");
  TORCH_CHECK_VALUE(x.device().is_cpu() || x.device().is_cuda() || x.device().is_meta(), name,
              " must be on a CPU or CUDA device, got ", device_str(x.device()));
  check_last_dim_contiguous(x, name);
}

void check_written(const char* op, const at::Tensor& out, const char* name, const at::Tensor& read,
                   const char* read_name) {
  if (out.is_meta() || out.numel() == 0 || read.numel() == 0) return;
  TORCH_CHECK_VALUE(at::has_internal_overlap(out) != at::MemOverlap::Yes, op, ": ", name,
                    " is written, but some of its elements share memory (an expanded view, stride 0): ",
                    "pass a tensor that owns its elements, e.g. ", name, ".clone()");
  const auto [out_first, out_last] = byte_span(out);
  const auto [read_first, read_last] = byte_span(read);
  TORCH_CHECK_VALUE(out_last < read_first || read_last < out_first, op, ": ", name,
                    " is written while ", read_name, " is read, and their memory overlaps: pass ",
                    name, " and ", read_name, " in separate memory");
}

void check_like(const at::Tensor& t, const char* name, const at::Tensor& x, const char* x_name) {
  TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), name, " must have the dtype of ", x_name, " (",
              x.scalar_type(), "), got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == x.device(), name, " must be on the device of ", x_name, " (",
                    device_str(x.device()), "), got ", device_str(t.device()));
  TORCH_CHECK_VALUE(t.sym_sizes() == x.sym_sizes(), name, " must have the shape of ", x_name, " ",
                    dims_str(x.sym_sizes()), ", got ", dims_str(t.sym_sizes()));
  check_last_dim_contiguous(t, name);
}

std::optional<at::Tensor> channel_vector(const std::optional<at::Tensor>& t, const char* name,
                                         const at::Tensor& x, const char* x_name, bool or_float32) {
  if (!t) return std::nullopt;
  const char* alternative = or_float32 ? " or float32" : "";
  TORCH_CHECK_TYPE(t->scalar_type() == x.scalar_type() || (or_float32 && t->scalar_type() == at::kFloat), name,
                   " must have the dtype of ", x_name, " (", x.scalar_type(), ")", alternative, ", got ",
                   t->scalar_type());
  TORCH_CHECK_VALUE(t->device() == x.device(), name, " must be on the device of ", x_name, " (",
                    device_str(x.device()), "), got ", device_str(t->device()));
  TORCH_CHECK_VALUE(t->dim() == 1 && t->sym_size(0) == x.sym_size(-1), name, " must have shape ",
                    dim_str(x.sym_size(-1)), " (the last dim of ", x_name, "), got ",
                    dims_str(t->sym_sizes()));
  return t->contiguous();
}

std::optional<int64_t> collapsed_row_stride(const at::Tensor& t) {
  // Walk the leading dims from the innermost out; size-1 dims carry no stride.
  int64_t stride = t.size(-1);  // the stride of a single row does not matter
  int64_t span = -1;            // elements spanned by one step of the inner non-trivial dim
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (span < 0) {
      stride = t.stride(d);
    } else if (t.stride(d) != span) {
      return std::nullopt;
    }
    span = t.stride(d) * t.size(d);
  }
  return stride;
}

at::Tensor linear_rounded_once(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (x.is_cuda() || x.scalar_type() == at::kFloat) return at::linear(x, weight, bias);
  const std::optional<at::Tensor> bias32 = bias ? std::optional(bias->to(at::kFloat)) : std::nullopt;
  return at::linear(x.to(at::kFloat), weight.to(at::kFloat), bias32).to(x.scalar_type());
}

at::Tensor aligned16(const at::Tensor& t) {
  bool aligned = reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0 && (t.dim() == 0 || t.stride(-1) == 1);
  for (int64_t d = 0; d + 1 < t.dim() && aligned; ++d) aligned = t.stride(d) * t.element_size() % 16 == 0;
  return aligned ? t : at::empty(t.sizes(), t.options()).copy_(t);
}

Rows as_rows(const at::Tensor& t) {
  Rows r;
  r.cols = t.size(-1);
  r.rows = r.cols == 0 ? 0 : t.numel() / r.cols;
  const std::optional<int64_t> stride = collapsed_row_stride(t);
  r.tensor = stride ? t : t.contiguous();
  r.row_stride = stride ? *stride : r.cols;
  return r;
}

bool rows_dense_in_memory(const at::Tensor& t) {
  return t.dim() >= 1 && t.sym_stride(-1) == 1 && t.is_non_overlapping_and_dense();
}

Rows memory_order_rows(const at::Tensor& t) {
  Rows r;
  r.tensor = t;
  r.cols = t.size(-1);
  r.rows = r.cols == 0 ? 0 : t.numel() / r.cols;
  r.row_stride = r.cols;
  return r;
}

void check_grad(const at::Tensor& grad, const char* name, const at::Tensor& x, at::ScalarType out_dtype,
                const char* x_name) {
  TORCH_CHECK_TYPE(grad.scalar_type() == out_dtype, name, " must have the output's dtype (", out_dtype, "), got ",
                   grad.scalar_type());
  TORCH_CHECK_VALUE(grad.device() == x.device(), name, " must be on the device of ", x_name, " (",
                    device_str(x.device()), "), got ", device_str(grad.device()));
  TORCH_CHECK_VALUE(grad.sym_sizes() == x.sym_sizes(), name, " must have the shape of ", x_name, " ",
                    dims_str(x.sym_sizes()), ", got ", dims_str(grad.sym_sizes()));
}

void check_linear_grad(const at::Tensor& grad_out, const at::Tensor& x, const char* x_name, const at::Tensor& weight) {
  TORCH_CHECK_TYPE(grad_out.scalar_type() == x.scalar_type(), "grad_out must have the dtype of ", x_name, " (",
                   x.scalar_type(), "), got ", grad_out.scalar_type());
  TORCH_CHECK_VALUE(grad_out.device() == x.device() && grad_out.dim() == x.dim() &&
                        grad_out.sym_sizes().slice(0, x.dim() - 1) == x.sym_sizes().slice(0, x.dim() - 1) &&
                        grad_out.sym_size(-1) == weight.sym_size(0),
                    "grad_out must be on the device of ", x_name, " with shape [..., N]: ", x_name,
                    "'s leading dims and weight's N (", x_name, " ", dims_str(x.sym_sizes()), ", weight ",
                    dims_str(weight.sym_sizes()), "), got ", dims_str(grad_out.sym_sizes()));
}

at::Tensor last_dim_contiguous(const at::Tensor& grad) {
  return grad.dim() == 0 || grad.sym_size(-1) <= 1 || grad.sym_stride(-1) == 1 ? grad : grad.contiguous();
}

int64_t batches_of(const at::Tensor& x) { return x.dim() >= 3 ? x.size(0) : 1; }

void check_row_vectors(const at::Tensor& t, const char* name, const at::Tensor& x) {
  TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), name, " must have the dtype of x (",
                   x.scalar_type(), "), got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == x.device(), name, " must be on the device of x (",
                    device_str(x.device()), "), got ", device_str(t.device()));
  const auto expected = [&] {
    return std::string(name) + " must have shape [D], [B, 1, D] (per batch) or x's shape " +
           dims_str(x.sym_sizes()) + " (per token), got " + dims_str(t.sym_sizes());
  };
  TORCH_CHECK_VALUE(t.dim() >= 1 && t.sym_size(-1) == x.sym_size(-1), expected());
  check_last_dim_contiguous(t, name);
  if (t.dim() == 1) return;  // [D]
  TORCH_CHECK_VALUE(t.dim() == x.dim(), expected());
  bool per_token = true, per_batch = true;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    per_token = per_token && t.sym_size(d) == x.sym_size(d);
    // Dim 0 is the batch of a [B, S.., D] x; for a 2-dim x it is the token dim.
    const bool batch_dim = d == 0 && x.dim() >= 3;
    per_batch = per_batch && (t.sym_size(d) == 1 || (batch_dim && t.sym_size(d) == x.sym_size(d)));
  }
  TORCH_CHECK_VALUE(per_token || per_batch, expected());
}

RowVectors row_vectors(const at::Tensor& t, const at::Tensor& x, at::Tensor& keep) {
  keep = t;
  RowVectors v;
  if (t.dim() == 1) {
    v.ptr = t.const_data_ptr();
    return v;
  }
  const bool has_batch_dim = x.dim() >= 3;
  // Per-token dims: all but the last, after the batch dim when there is one.
  const at::Tensor tokens_view = has_batch_dim ? t.select(0, 0) : t;
  bool per_token = false;
  for (int64_t d = has_batch_dim ? 1 : 0; d + 1 < t.dim(); ++d) per_token |= t.size(d) > 1;
  if (per_token) {
    std::optional<int64_t> stride = collapsed_row_stride(tokens_view);
    if (!stride) {
      keep = t.contiguous();
      stride = collapsed_row_stride(has_batch_dim ? keep.select(0, 0) : keep);
    }
    v.token_stride = *stride;
  }
  if (has_batch_dim && t.size(0) > 1) v.batch_stride = keep.stride(0);
  v.ptr = keep.const_data_ptr();
  return v;
}

#ifdef LTX_KERNELS_WITH_CUDA
void check_compute_capability(const at::Tensor& x, int minimum, const char* op, const char* lacks) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(x.device().index());
  const int capability = prop->major * 10 + prop->minor;
  TORCH_CHECK_VALUE(capability >= minimum, op, ": ", prop->name, " (compute capability ", std::to_string(prop->major),
                    ".", std::to_string(prop->minor), ") ", lacks, "; it needs compute capability ",
                    std::to_string(minimum / 10), ".", std::to_string(minimum % 10), " or newer");
}
#endif

// Raised again with the op's name in front, as the same c10 error type (so the same Python
// exception); TORCH_CHECK_* stream only strings here (see the note on formatting above).
[[noreturn]] void rethrow_naming(const c10::Error& error, const char* op) {
  const std::string prefix = std::string(op) + ": ";
  if (error.msg().rfind(prefix, 0) == 0) throw;
  const std::string message = prefix + error.msg();
  if (dynamic_cast<const c10::TypeError*>(&error) != nullptr) TORCH_CHECK_TYPE(false, std::string(message));
  if (dynamic_cast<const c10::ValueError*>(&error) != nullptr) TORCH_CHECK_VALUE(false, std::string(message));
  if (dynamic_cast<const c10::NotImplementedError*>(&error) != nullptr) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, std::string(message));
  }
  if (dynamic_cast<const c10::IndexError*>(&error) != nullptr) TORCH_CHECK_INDEX(false, std::string(message));
  throw;  // other c10 errors (out of memory, ...) as they are
}

}  // namespace ltx_kernels::torch_ext
