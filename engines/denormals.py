"""Subnormal floats on CPU engines: computed as IEEE says (the default), or flushed to zero.

x86 CPUs compute an operation whose input or result is subnormal (nonzero, below ~1.2e-38
in FP32) through a slower path (a microcode assist on Intel; on this AMD EPYC a torch
multiply over 4M subnormal FP32 values took 1.3x the time of normal ones, docs/engines.md,
and mobilenet_v2 did not slow down at all). Flushing (FTZ: subnormal results become 0;
DAZ: subnormal inputs are read as 0) removes the assist and changes results only where a subnormal appears.

The mode lives in each thread's MXCSR register, and a thread starts with its creator's, so
it is set once where an engine instance's thread starts (``batchers.executor.engine_thread``),
before the engine is built on it: torch's OpenMP team and ONNX Runtime's intra-op threads,
created later from that thread, inherit it. GPU engines (torch CUDA, TensorRT) are not
affected: their kernels' subnormal handling is fixed when the kernels are compiled.
"""

from __future__ import annotations

import logging

log = logging.getLogger("wattserve.engines.denormals")


def flush_denormals_on_this_thread() -> None:
    """Thread initializer: flush subnormals to zero (FTZ and DAZ) on the calling thread and
    every thread it starts later. torch's ``set_flush_denormal`` sets the register (x86 SSE3
    and ARM); it answers False where the CPU has no such mode, and then nothing changes."""
    import torch

    if not torch.set_flush_denormal(True):
        log.warning("this CPU cannot flush subnormal floats to zero; they are computed as IEEE says")
