"""memlib.measure: the tracer and every PyTorch-based measurement (CPU traces, CUDA readings, distributed runs)."""
