"""Per-model-family integrations (DESIGN.md section 7): one module per family, each declaring
the model classes it handles (:class:`~ltx_kernels.integrations.family.Family`), one registry per
framework (:mod:`ltx_kernels.integrations.diffusers`). The user-facing calls stay
:func:`ltx_kernels.diffusers.inject` / :func:`ltx_kernels.transformers.apply`."""
