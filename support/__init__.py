"""Code shared by the tests and the benchmarks, kept out of both so neither imports the other:
named doubles for hardware this machine lacks (NVML, TensorRT, CUDA graph capture), a
builder for a small Triton model repository, and the parts of benchmarks their tests check
(docs/architecture.md lists them). Not installed with wattserve."""
