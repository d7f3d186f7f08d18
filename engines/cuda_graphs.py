"""CUDA graphs for the torch engine: one captured graph per batch bucket, replayed.

A CUDA graph replays a whole forward pass as one launch, removing per-kernel launch
overhead (large at small batches on fast GPUs). A graph is fixed to the shapes it was
captured with, so one is captured per bucket (default 1, 2, 4, ..., max), a batch is padded
up to the nearest bucket (repeating its last row), and the outputs are sliced back.

Capture follows torch's documented recipe: warm up on a side stream, then capture under
``torch.cuda.graph`` into static input/output tensors; every bucket shares one memory pool,
which is safe here because each call copies its result out before the next replay.

Written against torch's CUDA graph API; this machine has no GPU, so the capture itself runs
only in scripts/gpu_check.sh. The bucket/pad/copy/slice logic around it is tested on CPU with a
named test double for the capture step (support/doubles/fake_cuda_graphs.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from wattserve.engines.base import Batch, EngineError, EngineUnavailable
from wattserve.engines.config import EngineConfig
from wattserve.engines.profiles import choose_bucket, default_buckets, normalize_buckets

log = logging.getLogger(__name__)


class Replayable(Protocol):
    def replay(self) -> None: ...


# capture(module, static_input, pool, warmup_iters) -> (graph, static_output)
CaptureFn = Callable[[torch.nn.Module, torch.Tensor, Any, int], tuple[Replayable, torch.Tensor]]


def capture_cuda_graph(
    module: torch.nn.Module, static_input: torch.Tensor, pool: Any, warmup_iters: int
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warm ``module`` up on a side stream, then capture one forward pass into a graph."""
    device = static_input.device
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(warmup_iters):  # cuDNN picks algorithms, allocator settles
            module(static_input)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool), torch.no_grad():
        static_output = module(static_input)
    return graph, static_output


def _new_pool(device: torch.device) -> Any:
    return torch.cuda.graph_pool_handle() if device.type == "cuda" else None


class CudaGraphRunner:
    """Runs ``module`` on any batch up to the largest bucket by replaying captured graphs."""

    def __init__(
        self,
        module: torch.nn.Module,
        item_shape: Sequence[int],
        buckets: Sequence[int],
        device: torch.device | str,
        *,
        dtype: torch.dtype = torch.float32,
        memory_format: torch.memory_format = torch.contiguous_format,
        warmup_iters: int = 3,
        capture: CaptureFn | None = None,
    ) -> None:
        self.device = torch.device(device)
        if capture is None:
            if self.device.type != "cuda":
                raise EngineUnavailable(f"CUDA graphs need a CUDA device, not {self.device}")
            if not torch.cuda.is_available():
                raise EngineUnavailable("CUDA graphs asked for, but torch sees no CUDA device")
            capture = capture_cuda_graph
        self.buckets = normalize_buckets(buckets)
        self.item_shape = tuple(item_shape)
        self._graphs: dict[int, tuple[Replayable, torch.Tensor, torch.Tensor]] = {}
        pool = _new_pool(self.device)
        # Largest first: its activations bound the pool; smaller graphs then fit inside it.
        for bucket in reversed(self.buckets):
            static_input = torch.zeros((bucket, *self.item_shape), dtype=dtype, device=self.device)
            if len(self.item_shape) == 3:
                static_input = static_input.contiguous(memory_format=memory_format)
            graph, static_output = capture(module, static_input, pool, warmup_iters)
            self._graphs[bucket] = (graph, static_input, static_output)
        log.info("captured CUDA graphs for batch buckets %s on %s", self.buckets, self.device)

    @property
    def max_batch_size(self) -> int:
        return self.buckets[-1]

    def padded_size(self, batch_size: int) -> int:
        return choose_bucket(batch_size, self.buckets)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Outputs for the ``x.shape[0]`` rows of ``x`` (a new tensor, on the graph's device)."""
        n = int(x.shape[0])
        if tuple(x.shape[1:]) != self.item_shape:
            raise ValueError(f"items are {tuple(x.shape[1:])}, graphs were captured for {self.item_shape}")
        graph, static_input, static_output = self._graphs[self.padded_size(n)]
        static_input[:n].copy_(x, non_blocking=False)
        if static_input.shape[0] > n:  # pad with the last real row, like engines.profiles.pad_batch
            static_input[n:].copy_(static_input[n - 1 : n].expand_as(static_input[n:]))
        graph.replay()
        # Copy out: the next replay of this bucket overwrites static_output in place.
        return static_output[:n].clone()


class CudaGraphEngine:
    """The torch engine's model behind CUDA graphs: same contract, any size up to the max."""

    platform = "pytorch"

    def __init__(
        self,
        engine: Any,
        buckets: Sequence[int],
        *,
        channels_last: bool = True,
        capture: CaptureFn | None = None,
    ) -> None:
        (spec,) = engine.inputs
        self.name = engine.name
        self.device = engine.device
        self.inputs = engine.inputs
        self.outputs = engine.outputs
        self._input_name = spec.name
        (self._output_name,) = (s.name for s in engine.outputs)
        self._inner = engine
        dtype = next(engine.model.parameters()).dtype  # fp16 when the engine halved the model
        self.runner = CudaGraphRunner(
            engine.model,
            spec.shape,
            buckets,
            torch.device(engine.device),
            dtype=dtype,
            memory_format=torch.channels_last if channels_last else torch.contiguous_format,
            capture=capture,
        )
        self.max_batch_size = self.runner.max_batch_size
        self.batch_sizes: Sequence[int] | None = tuple(self.runner.buckets)

    @classmethod
    def from_config(cls, engine: Any, config: EngineConfig) -> CudaGraphEngine:
        """Wrap a built torch engine; buckets from ``engine_batch_sizes`` or 1, 2, 4, ... max."""
        buckets = list(config.engine_batch_sizes or default_buckets(config.max_batch_size))
        if max(buckets) < config.max_batch_size:
            raise EngineUnavailable(
                f"engine_batch_sizes {buckets} do not reach max_batch_size {config.max_batch_size}"
            )
        return cls(engine, buckets, channels_last=config.channels_last)

    def padded_size(self, batch_size: int) -> int:
        return self.runner.padded_size(batch_size)

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        try:
            x = torch.from_numpy(np.ascontiguousarray(batch[self._input_name], dtype=np.float32))
        except KeyError as exc:
            raise EngineError(f"{self.name}: missing input {self._input_name!r}") from exc
        try:
            out = self.runner(x)
        except ValueError as exc:
            raise EngineError(f"{self.name}: {exc}") from exc
        return {self._output_name: out.float().cpu().numpy()}

    def close(self) -> None:
        # Drop the graphs and their pools. No call follows close() (the Engine contract), so the
        # attribute keeps the live runner's type rather than an Optional every call must test.
        self.runner = None  # type: ignore[assignment]
        self._inner.close()
