// Activations in double for the CPU references, in the forms that stay exact for large
// negative inputs (no cancellation in 1 + tanh or 1 + erf), as the CUDA kernels compute them.
#pragma once

#include <cmath>

namespace ltx_kernels::host {

// 0.5 x (1 + tanh(u)) == x / (1 + e^(-2u)).
inline double gelu_tanh(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return x / (1.0 + std::exp(-2.0 * k * (x + 0.044715 * x * x * x)));
}

// 0.5 x (1 + erf(x / sqrt 2)) == 0.5 x erfc(-x / sqrt 2).
inline double gelu(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }

inline double silu(double x) { return x / (1.0 + std::exp(-x)); }

}  // namespace ltx_kernels::host
