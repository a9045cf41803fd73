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

// Derivatives, for the backward ops. With s = sigmoid(z): d/dx [x s(z(x))] = s + x s (1 - s) z'(x).
inline double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

inline double gelu_tanh_grad(double x) {
  const double k = 2.0 * std::sqrt(2.0 / M_PI);
  const double s = sigmoid(k * (x + 0.044715 * x * x * x));
  return s + x * s * (1.0 - s) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

// Phi(x) + x phi(x), phi the standard normal density.
inline double gelu_grad(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

inline double silu_grad(double x) {
  const double s = sigmoid(x);
  return s + x * s * (1.0 - s);
}

}  // namespace ltx_kernels::host
