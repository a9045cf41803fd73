// Every operator's schema, in one place. Implementations (CPU, CUDA, Meta) live in the file
// of their op family. Float arguments are `float` (double) in schemas, as torch requires.
#include <torch/library.h>

TORCH_LIBRARY(ltx_kernels, m) {
  // Norm family (norm.cpp). weight_offset = 1 gives Gemma's (1 + weight).
  m.def("rms_norm(Tensor x, Tensor? weight=None, float eps=1e-6, float weight_offset=0.0)"
        " -> Tensor");
  m.def("fused_add_rms_norm(Tensor x, Tensor residual, Tensor? weight=None, float eps=1e-6,"
        " float weight_offset=0.0) -> (Tensor out, Tensor new_residual)");
  m.def("fused_add_rms_norm_(Tensor x, Tensor(a!) residual, Tensor? weight=None,"
        " float eps=1e-6, float weight_offset=0.0) -> Tensor");
  m.def("layer_norm(Tensor x, Tensor? weight=None, Tensor? bias=None, float eps=1e-5)"
        " -> Tensor");
  // DiT forms (norm.cpp): AdaLN modulation norm(x) * (1 + scale) + shift, scale/shift/gate
  // broadcast as [D], [B, 1, D] or per token [B, S, D].
  m.def("adaln_rms_norm(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None,"
        " float eps=1e-6) -> Tensor");
  m.def("adaln_layer_norm(Tensor x, Tensor scale, Tensor shift, Tensor? weight=None,"
        " Tensor? bias=None, float eps=1e-6) -> Tensor");
  m.def("gated_residual_adaln_rms_norm(Tensor x, Tensor y, Tensor? gate, Tensor scale,"
        " Tensor shift, Tensor? weight=None, float eps=1e-6) -> (Tensor x_new, Tensor normed)");
}
