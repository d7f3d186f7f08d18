"""FakeCudaGraph: a test double for ``torch.cuda.CUDAGraph`` capture (no GPU here).

A real graph replays the captured kernels, reading the static input tensor and writing the
same static output tensor in place. This double keeps exactly that contract on the CPU:
``replay()`` recomputes the module from the static input into the static output's storage.
It does not capture anything; it only lets the bucket/pad/copy/slice logic around capture be
tested. Real capture runs in scripts/gpu_check.sh.
"""

from __future__ import annotations

from typing import Any

import torch


class FakeCudaGraph:
    def __init__(self, module: torch.nn.Module, static_input: torch.Tensor, static_output: torch.Tensor):
        self.module = module
        self.static_input = static_input
        self.static_output = static_output
        self.replays = 0

    def replay(self) -> None:
        with torch.no_grad():
            self.static_output.copy_(self.module(self.static_input))
        self.replays += 1


class FakeCapture:
    """Callable with the signature of engines.cuda_graphs.capture_cuda_graph; records captures."""

    def __init__(self) -> None:
        self.graphs: dict[int, FakeCudaGraph] = {}

    def __call__(self, module: torch.nn.Module, static_input: torch.Tensor, pool: Any, warmup_iters: int):
        with torch.no_grad():
            static_output = module(static_input)
        graph = FakeCudaGraph(module, static_input, static_output)
        self.graphs[int(static_input.shape[0])] = graph
        return graph, static_output
