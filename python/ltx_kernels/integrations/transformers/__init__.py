"""transformers model families whose integration goes beyond :mod:`ltx_kernels.transformers`'
shared decoder-layer patches, one module each: Falcon (:mod:`.falcon`)."""
