// torch bindings of the FP8 linear path: quantize_fp8 (rows to e4m3 + one fp32 scale per
// row, include/ltx_kernels/quantize.h) and fp8_linear (the GEMM of two such operands).
//
// fp8_linear computes out = (x_q @ weight_q^T) * x_scale[:, None] * weight_scale[None, :]
// (+ bias), fp32 accumulation, rounded once to out_dtype (include/ltx_kernels/fp8_linear.h).
// CUDA: our CUTLASS kernel on Hopper for bf16/fp16 outputs at shapes that fill the GPU,
// otherwise torch._scaled_mm (cuBLASLt). CPU: the C++ reference, so CI tests the format.
#include <ATen/ATen.h>

#include "ltx_kernels/fp8_linear.h"
#include "ltx_kernels/quantize.h"
#include "torch/common.h"
#include "torch/registration.h"

#ifdef LTX_KERNELS_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif

namespace ltx_kernels::torch_ext {
namespace {

using OptTensor = std::optional<at::Tensor>;

c10::SymDimVector row_shape(const at::Tensor& x) {
  return c10::SymDimVector(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
}

QuantizeActivation activation_of(c10::string_view activation) {
  if (activation == "gelu_tanh") return QuantizeActivation::kGeluTanh;
  TORCH_CHECK_VALUE(activation == "none", "quantize_fp8: activation must be 'none' or 'gelu_tanh', got '",
                    std::string(activation), "'");
  return QuantizeActivation::kNone;
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_meta(const at::Tensor& x, c10::string_view activation) {
  check_activation(x, "x");
  activation_of(activation);
  return {at::empty_symint(x.sym_sizes(), x.options().dtype(at::kFloat8_e4m3fn)),
          at::empty_symint(row_shape(x), x.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8(const at::Tensor& x, c10::string_view activation) {
  auto [out, scale] = quantize_fp8_meta(x, activation);
  const Rows rows = as_rows(x);
  if (rows.rows == 0) return {out, scale};
  QuantizeParams p;
  p.dtype = to_dtype(x.scalar_type());
  p.activation = activation_of(activation);
  p.rows = rows.rows;
  p.cols = rows.cols;
  p.x = rows.tensor.const_data_ptr();
  p.x_row_stride = rows.row_stride;
  p.out = static_cast<uint8_t*>(out.mutable_data_ptr());
  p.out_row_stride = rows.cols;
  p.scale = scale.mutable_data_ptr<float>();
  run(p, x, "quantize_fp8");
  return {out, scale};
}

// The cuBLASLt FP8 GEMM takes K and N in multiples of 16; the CPU and Meta implementations
// check the same, so a shape that CI accepts runs on the GPU.
void check_fp8_linear(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                      const at::Tensor& weight_scale, const OptTensor& bias, at::ScalarType out_dtype) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat8_e4m3fn && weight.scalar_type() == at::kFloat8_e4m3fn,
                   "fp8_linear: x and weight must be float8_e4m3fn (see quantize_fp8), got ",
                   x.scalar_type(), " and ", weight.scalar_type());
  TORCH_CHECK_TYPE(x_scale.scalar_type() == at::kFloat && weight_scale.scalar_type() == at::kFloat,
                   "fp8_linear: x_scale and weight_scale must be float32, got ", x_scale.scalar_type(),
                   " and ", weight_scale.scalar_type());
  TORCH_CHECK_TYPE(out_dtype == at::kFloat || out_dtype == at::kHalf || out_dtype == at::kBFloat16,
                   "fp8_linear: out_dtype must be float32, float16 or bfloat16, got ", out_dtype);
  const at::Device device = x.device();
  for (const auto& [t, name] : {std::pair{&x_scale, "x_scale"}, {&weight, "weight"}, {&weight_scale, "weight_scale"}}) {
    TORCH_CHECK_VALUE(t->device() == device, "fp8_linear: ", name, " must be on x's device ",
                      device_str(device), ", got ", device_str(t->device()));
  }
  TORCH_CHECK_VALUE(x.dim() >= 1, "fp8_linear: x must have at least 1 dim");
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.sym_size(1) == x.sym_size(-1),
                    "fp8_linear: weight must be [N, K] with K = x's last dim (x ", dims_str(x.sym_sizes()),
                    "), got ", dims_str(weight.sym_sizes()));
  const c10::SymDimVector rows = row_shape(x);
  TORCH_CHECK_VALUE(x_scale.sym_sizes() == c10::SymIntArrayRef(rows), "fp8_linear: x_scale must have x's "
                    "shape without its last dim, ", dims_str(rows), ", got ", dims_str(x_scale.sym_sizes()));
  TORCH_CHECK_VALUE(weight_scale.dim() == 1 && weight_scale.sym_size(0) == weight.sym_size(0),
                    "fp8_linear: weight_scale must be [N] with N = weight.size(0) (weight ",
                    dims_str(weight.sym_sizes()), "), got ", dims_str(weight_scale.sym_sizes()));
  TORCH_CHECK_VALUE(x.sym_size(-1) % 16 == 0 && weight.sym_size(0) % 16 == 0,
                    "fp8_linear: K and N must be multiples of 16 (the FP8 GEMM's granularity), got "
                    "weight [N, K] = ", dims_str(weight.sym_sizes()));
  if (bias) {
    TORCH_CHECK_TYPE(bias->scalar_type() == out_dtype, "fp8_linear: bias must have out_dtype ", out_dtype,
                     ", got ", bias->scalar_type());
    TORCH_CHECK_VALUE(bias->device() == device && bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0),
                      "fp8_linear: bias must be [N] on x's device, N = weight.size(0) (weight ",
                      dims_str(weight.sym_sizes()), "), got ", dims_str(bias->sym_sizes()), " on ",
                      device_str(bias->device()));
  }
}

c10::SymDimVector out_shape(const at::Tensor& x, const at::Tensor& weight) {
  c10::SymDimVector shape(x.sym_sizes().begin(), x.sym_sizes().end());
  shape.back() = weight.sym_size(0);
  return shape;
}

at::Tensor fp8_linear_meta(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                           const at::Tensor& weight_scale, const OptTensor& bias, at::ScalarType out_dtype) {
  check_fp8_linear(x, x_scale, weight, weight_scale, bias, out_dtype);
  return at::empty_symint(out_shape(x, weight), x.options().dtype(out_dtype));
}

// The params of out = fp8_linear(...) for x as contiguous [M, K] rows `a`.
Fp8LinearParams params_of(const at::Tensor& a, const at::Tensor& x_scale, const at::Tensor& weight,
                          const at::Tensor& weight_scale, const OptTensor& bias, at::Tensor& out) {
  Fp8LinearParams p;
  p.out_dtype = to_dtype(out.scalar_type());
  p.m = a.size(0);
  p.n = weight.size(0);
  p.k = weight.size(1);
  p.a = static_cast<const uint8_t*>(a.const_data_ptr());
  p.a_row_stride = a.stride(0);
  p.b = static_cast<const uint8_t*>(weight.const_data_ptr());
  p.b_row_stride = weight.stride(0);
  p.a_scale = x_scale.const_data_ptr<float>();
  p.b_scale = weight_scale.const_data_ptr<float>();
  p.bias = data_or_null(bias);
  p.out = out.mutable_data_ptr();
  p.out_row_stride = p.n;
  return p;
}

at::Tensor fp8_linear_cpu(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                          const at::Tensor& weight_scale, const OptTensor& bias, at::ScalarType out_dtype) {
  at::Tensor out = fp8_linear_meta(x, x_scale, weight, weight_scale, bias, out_dtype);
  const at::Tensor a = x.reshape({-1, x.size(-1)}).contiguous();
  // (named: p points into them)
  const at::Tensor xs = x_scale.contiguous(), w = weight.contiguous(), ws = weight_scale.contiguous();
  const OptTensor b = bias ? std::optional(bias->contiguous()) : std::nullopt;
  const Fp8LinearParams p = params_of(a, xs, w, ws, b, out);
  check_core(p, "fp8_linear");
  reference(p);
  return out;
}

#ifdef LTX_KERNELS_WITH_CUDA
// fp32 accumulator [M, N] -> scaled, biased, rounded once.
at::Tensor epilogue(const at::Tensor& acc, const at::Tensor& x_scale, const at::Tensor& weight_scale,
                    const OptTensor& bias, at::ScalarType out_dtype) {
  at::Tensor out = acc * x_scale.reshape({-1, 1}) * weight_scale.reshape({1, -1});
  if (bias) out.add_(bias->to(at::kFloat));
  return out.to(out_dtype);
}

// cuBLASLt's FP8 GEMM (torch._scaled_mm): the GPUs and shapes our kernel does not take.
at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& x_scale, const at::Tensor& weight,
                     const at::Tensor& weight_scale, const OptTensor& bias, at::ScalarType out_dtype) {
  const at::Tensor b = weight.t();  // [K, N] column-major, as cuBLASLt wants
  if (out_dtype == at::kBFloat16) {
    // Row-wise scales are applied in the GEMM epilogue (bf16 output only).
    return at::_scaled_mm(a, b, x_scale.reshape({-1, 1}), weight_scale.reshape({1, -1}), bias, std::nullopt,
                          out_dtype);
  }
  // fp16 / fp32 outputs: an fp32 accumulator with unit scales, then the epilogue in torch ops
  // (one more pass over the output).
  const at::Tensor one = at::ones({}, x_scale.options());
  return epilogue(at::_scaled_mm(a, b, one, one, std::nullopt, std::nullopt, at::kFloat), x_scale, weight_scale,
                  bias, out_dtype);
}

#ifdef LTX_KERNELS_SM90A
// Our kernel fills the GPU with 128 x 256 output tiles; below one tile per SM cuBLASLt picks
// smaller tiles and is faster (H100: 333 x 1536 outputs 264 vs 151 TFLOPS; from 1000 x 3072
// on, ours is as fast or faster: benchmarks/results/h100/gemm.md).
bool fills_the_gpu(const Fp8LinearParams& p, const cudaDeviceProp& prop) {
  const int64_t tiles = (p.m + 127) / 128 * ((p.n + 255) / 256);
  return tiles * 2 >= prop.multiProcessorCount;
}
#endif

at::Tensor fp8_linear_cuda(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                           const at::Tensor& weight_scale, const OptTensor& bias, at::ScalarType out_dtype) {
  check_fp8_linear(x, x_scale, weight, weight_scale, bias, out_dtype);
  check_compute_capability(x, 89, "fp8_linear", "has no FP8 tensor cores (Ada, Hopper have them)");
  // cuBLASLt and our kernel load 16-byte aligned rows; a misaligned view is copied once.
  const at::Tensor a = aligned16(x.reshape({-1, x.size(-1)}).contiguous()), w = aligned16(weight.contiguous());
  const at::Tensor xs = x_scale.reshape({-1}).contiguous(), ws = weight_scale.contiguous();
  if (a.size(0) == 0 || a.size(1) == 0) {
    // No k: the accumulator is 0, the output the epilogue of 0 (the bias, NaN for a NaN scale).
    return epilogue(at::zeros({a.size(0), w.size(0)}, xs.options()), xs, ws, bias, out_dtype)
        .view_symint(out_shape(x, weight));
  }
#ifdef LTX_KERNELS_SM90A
  at::Tensor out = at::empty({a.size(0), w.size(0)}, x.options().dtype(out_dtype));
  Fp8LinearParams p = params_of(a, xs, w, ws, bias, out);
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(x.device().index());
  p.arch = prop->major * 10 + prop->minor;
  check_core(p, "fp8_linear");
  if (cuda_support(p) == nullptr && fills_the_gpu(p, *prop)) {
    const c10::cuda::CUDAGuard guard(x.device());
    const at::Tensor workspace = at::empty({workspace_bytes(p)}, x.options().dtype(at::kByte));
    const cudaError_t error = launch(p, workspace.data_ptr(), c10::cuda::getCurrentCUDAStream(x.device().index()));
    TORCH_CHECK(error == cudaSuccess, "fp8_linear: CUDA launch failed: ", cudaGetErrorString(error));
    return out.view_symint(out_shape(x, weight));
  }
#endif
  return scaled_mm(a, xs, w, ws, bias, out_dtype).view_symint(out_shape(x, weight));
}
#endif

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CPU, m) {
  m.impl("quantize_fp8", &quantize_fp8);
  m.impl("fp8_linear", &fp8_linear_cpu);
}
LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  m.impl("quantize_fp8", &quantize_fp8_meta);
  m.impl("fp8_linear", &fp8_linear_meta);
}
#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) {
  m.impl("quantize_fp8", &quantize_fp8);
  m.impl("fp8_linear", &fp8_linear_cuda);
}
#endif

}  // namespace ltx_kernels::torch_ext
