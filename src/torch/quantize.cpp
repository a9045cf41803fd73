// torch bindings of the FP8 linear path: quantize_fp8 (rows to e4m3 + one fp32 scale per
// row, include/ltx_kernels/quantize.h), fp8_linear (the GEMM of two such operands) and
// fp8_linear_gated_residual (residual + gate * fp8_linear, the epilogue writing the residual
// stream).
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

Fp8Activation activation_of(c10::string_view activation, const char* op) {
  if (activation == "gelu_tanh") return Fp8Activation::kGeluTanh;
  TORCH_CHECK_VALUE(activation == "none", op, ": activation must be 'none' or 'gelu_tanh', got '",
                    std::string(activation), "'");
  return Fp8Activation::kNone;
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8_meta(const at::Tensor& x, c10::string_view activation) {
  check_activation(x, "x");
  activation_of(activation, "quantize_fp8");
  return {at::empty_symint(x.sym_sizes(), x.options().dtype(at::kFloat8_e4m3fn)),
          at::empty_symint(row_shape(x), x.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor> quantize_fp8(const at::Tensor& x, c10::string_view activation) {
  auto [out, scale] = quantize_fp8_meta(x, activation);
  const Rows rows = as_rows(x);
  if (rows.rows == 0) return {out, scale};
  QuantizeParams p;
  p.dtype = to_dtype(x.scalar_type());
  p.activation = activation_of(activation, "quantize_fp8");
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
                      const at::Tensor& weight_scale, const OptTensor& bias, at::ScalarType out_dtype,
                      const char* op = "fp8_linear") {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat8_e4m3fn && weight.scalar_type() == at::kFloat8_e4m3fn,
                   op, ": x and weight must be float8_e4m3fn (see quantize_fp8), got ",
                   x.scalar_type(), " and ", weight.scalar_type());
  TORCH_CHECK_TYPE(x_scale.scalar_type() == at::kFloat && weight_scale.scalar_type() == at::kFloat,
                   op, ": x_scale and weight_scale must be float32, got ", x_scale.scalar_type(),
                   " and ", weight_scale.scalar_type());
  TORCH_CHECK_TYPE(out_dtype == at::kFloat || out_dtype == at::kHalf || out_dtype == at::kBFloat16,
                   op, ": out_dtype must be float32, float16 or bfloat16, got ", out_dtype);
  const at::Device device = x.device();
  for (const auto& [t, name] : {std::pair{&x_scale, "x_scale"}, {&weight, "weight"}, {&weight_scale, "weight_scale"}}) {
    TORCH_CHECK_VALUE(t->device() == device, op, ": ", name, " must be on x's device ",
                      device_str(device), ", got ", device_str(t->device()));
  }
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": x must have at least 1 dim");
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.sym_size(1) == x.sym_size(-1),
                    op, ": weight must be [N, K] with K = x's last dim (x ", dims_str(x.sym_sizes()),
                    "), got ", dims_str(weight.sym_sizes()));
  const c10::SymDimVector rows = row_shape(x);
  TORCH_CHECK_VALUE(x_scale.sym_sizes() == c10::SymIntArrayRef(rows), op, ": x_scale must have x's "
                    "shape without its last dim, ", dims_str(rows), ", got ", dims_str(x_scale.sym_sizes()));
  TORCH_CHECK_VALUE(weight_scale.dim() == 1 && weight_scale.sym_size(0) == weight.sym_size(0),
                    op, ": weight_scale must be [N] with N = weight.size(0) (weight ",
                    dims_str(weight.sym_sizes()), "), got ", dims_str(weight_scale.sym_sizes()));
  TORCH_CHECK_VALUE(x.sym_size(-1) % 16 == 0 && weight.sym_size(0) % 16 == 0,
                    op, ": K and N must be multiples of 16 (the FP8 GEMM's granularity), got "
                    "weight [N, K] = ", dims_str(weight.sym_sizes()));
  if (bias) {
    TORCH_CHECK_TYPE(bias->scalar_type() == out_dtype, op, ": bias must have out_dtype ", out_dtype,
                     ", got ", bias->scalar_type());
    TORCH_CHECK_VALUE(bias->device() == device && bias->dim() == 1 && bias->sym_size(0) == weight.sym_size(0),
                      op, ": bias must be [N] on x's device, N = weight.size(0) (weight ",
                      dims_str(weight.sym_sizes()), "), got ", dims_str(bias->sym_sizes()), " on ",
                      device_str(bias->device()));
  }
}

c10::SymDimVector out_shape(const at::Tensor& x, const at::Tensor& weight) {
  c10::SymDimVector shape(x.sym_sizes().begin(), x.sym_sizes().end());
  shape.back() = weight.sym_size(0);
  return shape;
}

// fp8_linear_gated_residual: x [B, S, K], residual [B, S, N] (its dtype is the output's, and
// bias's and gate's), gate [B, 1, N] or [N]: one gate row per batch of S rows; or none (ones).
void check_fp8_linear_gated_residual(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                                     const at::Tensor& weight_scale, const OptTensor& bias,
                                     const at::Tensor& residual, const OptTensor& maybe_gate) {
  constexpr const char* op = "fp8_linear_gated_residual";
  TORCH_CHECK_VALUE(x.dim() == 3, op, ": x must be [B, S, K], got ", dims_str(x.sym_sizes()));
  const at::ScalarType dtype = residual.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16, op,
                   ": residual must be float32, float16 or bfloat16 (the output's dtype), got ",
                   residual.scalar_type());
  check_fp8_linear(x, x_scale, weight, weight_scale, bias, dtype, op);
  TORCH_CHECK_VALUE(residual.device() == x.device(), op, ": residual must be on x's device ",
                    device_str(x.device()), ", got ", device_str(residual.device()));
  const c10::SymDimVector shape = out_shape(x, weight);
  TORCH_CHECK_VALUE(residual.sym_sizes() == c10::SymIntArrayRef(shape), op, ": residual must be [B, S, N] = ",
                    dims_str(shape), " (x's rows, weight's N), got ", dims_str(residual.sym_sizes()));
  if (!maybe_gate) return;
  const at::Tensor& gate = *maybe_gate;
  TORCH_CHECK_TYPE(gate.scalar_type() == dtype, op, ": gate must have residual's dtype ", residual.scalar_type(),
                   ", got ", gate.scalar_type());
  TORCH_CHECK_VALUE(gate.device() == x.device(), op, ": gate must be on x's device ", device_str(x.device()),
                    ", got ", device_str(gate.device()));
  const c10::SymInt& n = weight.sym_size(0);
  const bool per_batch = gate.dim() == 3 && gate.sym_size(0) == x.sym_size(0) && gate.sym_size(1) == 1 &&
                         gate.sym_size(2) == n;
  const std::vector<c10::SymInt> per_batch_shape = {x.sym_size(0), 1, n};
  TORCH_CHECK_VALUE(per_batch || (gate.dim() == 1 && gate.sym_size(0) == n), op,
                    ": gate must be [B, 1, N] or [N] with B = x.size(0), N = weight.size(0) (one gate row per "
                    "batch; for a per-token gate use fp8_linear, then gated_residual): expected ",
                    dims_str(per_batch_shape), " or ", dims_str({n}), ", got ", dims_str(gate.sym_sizes()));
}

at::Tensor fp8_linear_meta(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                           const at::Tensor& weight_scale, const OptTensor& bias, at::ScalarType out_dtype,
                           c10::string_view activation) {
  check_fp8_linear(x, x_scale, weight, weight_scale, bias, out_dtype);
  activation_of(activation, "fp8_linear");
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
                          const at::Tensor& weight_scale, const OptTensor& bias, at::ScalarType out_dtype,
                          c10::string_view activation) {
  at::Tensor out = fp8_linear_meta(x, x_scale, weight, weight_scale, bias, out_dtype, activation);
  const at::Tensor a = x.reshape({-1, x.size(-1)}).contiguous();
  // (named: p points into them)
  const at::Tensor xs = x_scale.contiguous(), w = weight.contiguous(), ws = weight_scale.contiguous();
  const OptTensor b = bias ? std::optional(bias->contiguous()) : std::nullopt;
  Fp8LinearParams p = params_of(a, xs, w, ws, b, out);
  p.activation = activation_of(activation, "fp8_linear");
  check_core(p, "fp8_linear");
  reference(p);
  return out;
}

at::Tensor fp8_linear_gated_residual_meta(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                                          const at::Tensor& weight_scale, const OptTensor& bias,
                                          const at::Tensor& residual, const OptTensor& gate) {
  check_fp8_linear_gated_residual(x, x_scale, weight, weight_scale, bias, residual, gate);
  return at::empty_symint(out_shape(x, weight), residual.options().memory_format(at::MemoryFormat::Contiguous));
}

// The gated residual's fields of p: residual rows r, gate rows of S = x.size(1) rows each (no
// gate: ones).
void set_gated_residual(Fp8LinearParams& p, const at::Tensor& x, const at::Tensor& r, const OptTensor& gate) {
  p.residual = r.const_data_ptr();
  p.residual_row_stride = r.stride(0);
  p.gate = gate ? gate->const_data_ptr() : nullptr;
  p.gate_batch_stride = gate && gate->dim() == 3 ? gate->stride(0) : 0;
  p.batch_rows = x.size(1);
}

at::Tensor fp8_linear_gated_residual_cpu(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                                         const at::Tensor& weight_scale, const OptTensor& bias,
                                         const at::Tensor& residual, const OptTensor& gate) {
  at::Tensor out = fp8_linear_gated_residual_meta(x, x_scale, weight, weight_scale, bias, residual, gate);
  if (out.numel() == 0) return out;
  const at::Tensor a = x.reshape({-1, x.size(-1)}).contiguous();
  // (named: p points into them)
  const at::Tensor xs = x_scale.contiguous(), w = weight.contiguous(), ws = weight_scale.contiguous();
  const at::Tensor r = residual.reshape({-1, residual.size(-1)}).contiguous();
  const OptTensor g = gate ? std::optional(gate->contiguous()) : std::nullopt;
  const OptTensor b = bias ? std::optional(bias->contiguous()) : std::nullopt;
  Fp8LinearParams p = params_of(a, xs, w, ws, b, out);
  set_gated_residual(p, x, r, g);
  check_core(p, "fp8_linear_gated_residual");
  reference(p);
  return out;
}

#ifdef LTX_KERNELS_WITH_CUDA
// fp32 accumulator [M, N] -> scaled, biased, activated, rounded once (the activation in
// torch's form here: within the reference's tolerance, not bit for bit with our kernel).
at::Tensor epilogue(const at::Tensor& acc, const at::Tensor& x_scale, const at::Tensor& weight_scale,
                    const OptTensor& bias, at::ScalarType out_dtype, Fp8Activation activation) {
  at::Tensor out = acc * x_scale.reshape({-1, 1}) * weight_scale.reshape({1, -1});
  if (bias) out.add_(bias->to(at::kFloat));
  if (activation == Fp8Activation::kGeluTanh) out = at::gelu(out, "tanh");
  return out.to(out_dtype);
}

// cuBLASLt's FP8 GEMM (torch._scaled_mm): the GPUs and shapes our kernel does not take.
at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& x_scale, const at::Tensor& weight,
                     const at::Tensor& weight_scale, const OptTensor& bias, at::ScalarType out_dtype,
                     Fp8Activation activation) {
  const at::Tensor b = weight.t();  // [K, N] column-major, as cuBLASLt wants
  if (out_dtype == at::kBFloat16 && activation == Fp8Activation::kNone) {
    // Row-wise scales are applied in the GEMM epilogue (bf16 output only).
    return at::_scaled_mm(a, b, x_scale.reshape({-1, 1}), weight_scale.reshape({1, -1}), bias, std::nullopt,
                          out_dtype);
  }
  // fp16 / fp32 outputs, or an activation: an fp32 accumulator with unit scales, then the
  // epilogue in torch ops (more passes over the output).
  const at::Tensor one = at::ones({}, x_scale.options());
  return epilogue(at::_scaled_mm(a, b, one, one, std::nullopt, std::nullopt, at::kFloat), x_scale, weight_scale,
                  bias, out_dtype, activation);
}

#ifdef LTX_KERNELS_SM90A
// Our kernel fills the GPU with 128 x 128 output tiles; below two waves of them cuBLASLt (the
// same tile, in clusters of 2 x 4 CTAs there, per the profiler) is as fast or faster for the
// plain GEMM (H100: 1000 x 3072 -> 3072, 1.5 waves, 26 vs 24 us; 333 x 5120 -> 1536 21 vs 20
// us). From 5376 x 2048 -> 2048 (5 waves) on, the two trade places by shape, ours at 0.89 to
// 1.06x cuBLASLt with fast accumulation (benchmarks/results/h100/gemm.md, gemm_pingpong.md).
// The gated residual always runs ours: cuBLASLt's fp32 output and the residual after it cost
// more (333 x 5120 -> 1536: 55 vs 34 us; FLUX's text stream, 512 x 3072 -> 3072: 71 vs 27 us;
// benchmarks/results/h100/gemm_stream_k.md).
bool ours_is_faster(const Fp8LinearParams& p, const cudaDeviceProp& prop) {
  if (p.residual != nullptr) return true;
  const int64_t tiles = (p.m + 127) / 128 * ((p.n + 127) / 128);
  return tiles >= 2 * prop.multiProcessorCount;
}

// Runs p on our Hopper kernel where it takes p and is the faster; false elsewhere (the caller
// then takes cuBLASLt).
bool launch_ours(Fp8LinearParams& p, const at::Tensor& x, const char* op) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(x.device().index());
  p.arch = prop->major * 10 + prop->minor;
  check_core(p, op);
  if (cuda_support(p) != nullptr || !ours_is_faster(p, *prop)) return false;
  const c10::cuda::CUDAGuard guard(x.device());
  // (the persistent scheduler of a plain GEMM needs none: no allocation then)
  const int64_t bytes = workspace_bytes(p);
  const at::Tensor workspace = bytes > 0 ? at::empty({bytes}, x.options().dtype(at::kByte)) : at::Tensor();
  const cudaError_t error = launch(p, bytes > 0 ? workspace.data_ptr() : nullptr,
                                   c10::cuda::getCurrentCUDAStream(x.device().index()));
  TORCH_CHECK(error == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(error));
  return true;
}
#endif

at::Tensor fp8_linear_cuda(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                           const at::Tensor& weight_scale, const OptTensor& bias, at::ScalarType out_dtype,
                           c10::string_view activation_name) {
  check_fp8_linear(x, x_scale, weight, weight_scale, bias, out_dtype);
  const Fp8Activation activation = activation_of(activation_name, "fp8_linear");
  check_compute_capability(x, 89, "fp8_linear", "has no FP8 tensor cores (Ada, Hopper have them)");
  // cuBLASLt and our kernel load 16-byte aligned rows; a misaligned view is copied once.
  const at::Tensor a = aligned16(x.reshape({-1, x.size(-1)}).contiguous()), w = aligned16(weight);
  const at::Tensor xs = x_scale.reshape({-1}).contiguous(), ws = weight_scale.contiguous();
  if (a.size(0) == 0 || a.size(1) == 0) {
    // No k: the accumulator is 0, the output the epilogue of 0 (the bias, NaN for a NaN scale).
    return epilogue(at::zeros({a.size(0), w.size(0)}, xs.options()), xs, ws, bias, out_dtype, activation)
        .view_symint(out_shape(x, weight));
  }
#ifdef LTX_KERNELS_SM90A
  at::Tensor out = at::empty({a.size(0), w.size(0)}, x.options().dtype(out_dtype));
  Fp8LinearParams p = params_of(a, xs, w, ws, bias, out);
  p.activation = activation;
  if (launch_ours(p, x, "fp8_linear")) return out.view_symint(out_shape(x, weight));
#endif
  return scaled_mm(a, xs, w, ws, bias, out_dtype, activation).view_symint(out_shape(x, weight));
}

at::Tensor fp8_linear_gated_residual_cuda(const at::Tensor& x, const at::Tensor& x_scale, const at::Tensor& weight,
                                          const at::Tensor& weight_scale, const OptTensor& bias,
                                          const at::Tensor& residual, const OptTensor& gate) {
  check_fp8_linear_gated_residual(x, x_scale, weight, weight_scale, bias, residual, gate);
  check_compute_capability(x, 89, "fp8_linear_gated_residual", "has no FP8 tensor cores (Ada, Hopper have them)");
  const at::ScalarType dtype = residual.scalar_type();
#ifdef LTX_KERNELS_SM90A
  if (x.numel() > 0 && dtype != at::kFloat) {
    const at::Tensor a = aligned16(x.reshape({-1, x.size(-1)}).contiguous()), w = aligned16(weight);
    const at::Tensor xs = x_scale.reshape({-1}).contiguous(), ws = weight_scale.contiguous();
    const at::Tensor r = residual.reshape({-1, residual.size(-1)}).contiguous();
    at::Tensor out = at::empty(residual.sizes(), residual.options().memory_format(at::MemoryFormat::Contiguous));
    at::Tensor out2d = out.view({-1, out.size(-1)});
    // The kernel reads each gate row as N consecutive elements: a strided last dim is copied
    // (LTX's gate, a [B, 1, N] view of its [B, 1, 6, N] modulation, is read in place).
    const OptTensor g = !gate || gate->stride(-1) == 1 ? gate : std::optional(gate->contiguous());
    Fp8LinearParams p = params_of(a, xs, w, ws, bias, out2d);
    set_gated_residual(p, x, r, g);
    if (launch_ours(p, x, "fp8_linear_gated_residual")) return out;
  }
#endif
  // Other GPUs and shapes: the linear's fp32 output (cuBLASLt), then the residual in fp32,
  // rounded once as the fused kernel does.
  const OptTensor bias32 = bias ? std::optional(bias->to(at::kFloat)) : std::nullopt;
  const at::Tensor y = fp8_linear_cuda(x, x_scale, weight, weight_scale, bias32, at::kFloat, "none");
  return (residual.to(at::kFloat) + (gate ? gate->to(at::kFloat) * y : y)).to(dtype).contiguous();
}
#endif

}  // namespace

LTX_KERNELS_LIBRARY_IMPL(CPU, m) {
  LTX_KERNELS_IMPL(m, "quantize_fp8", quantize_fp8);
  LTX_KERNELS_IMPL(m, "fp8_linear", fp8_linear_cpu);
  LTX_KERNELS_IMPL(m, "fp8_linear_gated_residual", fp8_linear_gated_residual_cpu);
}
LTX_KERNELS_LIBRARY_IMPL(Meta, m) {
  LTX_KERNELS_IMPL(m, "quantize_fp8", quantize_fp8_meta);
  LTX_KERNELS_IMPL(m, "fp8_linear", fp8_linear_meta);
  LTX_KERNELS_IMPL(m, "fp8_linear_gated_residual", fp8_linear_gated_residual_meta);
}
#ifdef LTX_KERNELS_WITH_CUDA
LTX_KERNELS_LIBRARY_IMPL(CUDA, m) {
  LTX_KERNELS_IMPL(m, "quantize_fp8", quantize_fp8);
  LTX_KERNELS_IMPL(m, "fp8_linear", fp8_linear_cuda);
  LTX_KERNELS_IMPL(m, "fp8_linear_gated_residual", fp8_linear_gated_residual_cuda);
}
#endif

}  // namespace ltx_kernels::torch_ext
