"""Code shared by the tests and the benchmarks, kept out of both so neither imports the other:
named doubles for hardware this machine lacks (NVML, TensorRT, CUDA graph capture) and a
builder for a small Triton model repository. Not installed with wattserve."""
