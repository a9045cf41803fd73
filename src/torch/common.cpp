#include "torch/common.h"

namespace ltx_kernels::torch_ext {
namespace {

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

std::string dim_str(const c10::SymInt& dim) { return dims_str(c10::SymIntArrayRef(&dim, 1)); }

std::string device_str(const at::Device& device) {
  std::string s = device.is_cuda() ? "cuda" : device.is_cpu() ? "cpu" : device.is_meta() ? "meta" : "other";
  return device.has_index() ? s + ":" + std::to_string(device.index()) : s;
}

}  // namespace

DType to_dtype(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: TORCH_CHECK_TYPE(false, "unsupported dtype ", type);
  }
}

void check_activation(const at::Tensor& x, const char* name) {
  const auto type = x.scalar_type();
  TORCH_CHECK_TYPE(type == at::kFloat || type == at::kHalf || type == at::kBFloat16, name,
              " must be float32, float16 or bfloat16, got ", type);
  TORCH_CHECK_VALUE(x.dim() >= 1, name, " must have at least 1 dim, got a 0-dim tensor");
  TORCH_CHECK_VALUE(x.device().is_cpu() || x.device().is_cuda() || x.device().is_meta(), name,
              " must be on a CPU or CUDA device, got ", device_str(x.device()));
  TORCH_CHECK_VALUE(x.sym_size(-1) <= 1 || x.sym_stride(-1) == 1, name,
              " must have a contiguous last dim (stride 1), got strides ", dims_str(x.sym_strides()),
              "; call .contiguous() if this layout is intended");
}

void check_like(const at::Tensor& t, const char* name, const at::Tensor& x, const char* x_name) {
  TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), name, " must have the dtype of ", x_name, " (",
              x.scalar_type(), "), got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == x.device(), name, " must be on the device of ", x_name, " (",
                    device_str(x.device()), "), got ", device_str(t.device()));
  TORCH_CHECK_VALUE(t.sym_sizes() == x.sym_sizes(), name, " must have the shape of ", x_name, " ",
                    dims_str(x.sym_sizes()), ", got ", dims_str(t.sym_sizes()));
}

std::optional<at::Tensor> channel_vector(const std::optional<at::Tensor>& t, const char* name,
                                         const at::Tensor& x, const char* x_name) {
  if (!t) return std::nullopt;
  TORCH_CHECK_TYPE(t->scalar_type() == x.scalar_type(), name, " must have the dtype of ", x_name,
              " (", x.scalar_type(), "), got ", t->scalar_type());
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

Rows as_rows(const at::Tensor& t) {
  Rows r;
  r.cols = t.size(-1);
  r.rows = r.cols == 0 ? 0 : t.numel() / r.cols;
  const std::optional<int64_t> stride = collapsed_row_stride(t);
  r.tensor = stride ? t : t.contiguous();
  r.row_stride = stride ? *stride : r.cols;
  return r;
}

}  // namespace ltx_kernels::torch_ext
