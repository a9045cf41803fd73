// Activations in double for the CPU references.
#pragma once

#include <cmath>

namespace ltx_kernels::host {

inline double gelu_tanh(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

}  // namespace ltx_kernels::host
