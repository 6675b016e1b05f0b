"""The patch tool of the XPU GEMM fakes project (`python -m xpufakes`)."""
