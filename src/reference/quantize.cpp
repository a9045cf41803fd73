// CPU reference of FP8 row quantization: the exact semantics of quantize.h, in fp32 as the
// kernel computes them (the rounding of each step is part of the format).
#include <stdexcept>
#include <vector>

#include "ltx_kernels/quantize.h"
#include "reference/activation.h"
#include "reference/convert.h"
#include "reference/fp8.h"

namespace ltx_kernels {

void reference(const QuantizeParams& p) {
  if (ValidationError error = validate(p)) throw std::invalid_argument(error);
  std::vector<float> values(static_cast<size_t>(p.cols));
  for (int64_t row = 0; row < p.rows; ++row) {
    for (int64_t c = 0; c < p.cols; ++c) {
      const float x = host::load(p.x, row * p.x_row_stride + c, p.dtype);
      values[c] = p.activation == Fp8Activation::kGeluTanh ? static_cast<float>(host::gelu_tanh(x)) : x;
    }
    host::quantize_row(values.data(), p.cols, p.out + row * p.out_row_stride, p.scale + row);
  }
}

}  // namespace ltx_kernels
