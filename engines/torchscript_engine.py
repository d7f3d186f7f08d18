"""A user's TorchScript file (``model.pt``), as Triton's pytorch_libtorch backend serves it.

TorchScript carries no tensor names or shapes, so they come from the model's config:
inputs are passed to ``forward`` positionally and outputs read back positionally, ordered
by Triton's ``NAME__<index>`` suffix when every name has one, else by config order.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from wattserve.engines.base import BF16, Batch, EngineError, EngineUnavailable, TensorSpec
from wattserve.engines.torch_engine import resolve_device

log = logging.getLogger("wattserve.engines.torchscript")

_INDEX = re.compile(r"__(\d+)$")


def triton_order(specs: Sequence[TensorSpec]) -> list[TensorSpec]:
    """Positional order: by the ``__<index>`` suffix when every name has one (Triton's
    convention), else as given."""
    indices = [_INDEX.search(s.name) for s in specs]
    if all(indices):
        keyed = [(int(m.group(1)), s) for m, s in zip(indices, specs, strict=True) if m is not None]
        return [s for _, s in sorted(keyed, key=lambda p: p[0])]
    return list(specs)


def to_torch(array: np.ndarray) -> torch.Tensor:
    """numpy -> torch without a copy; BF16 (ml_dtypes, which torch.from_numpy refuses)
    crosses as its 16-bit words. UINT16/32/64 cross as torch's uint16/32/64 (torch >= 2.3)."""
    if array.dtype == BF16:
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """torch (any device) -> numpy; bfloat16 comes back as ml_dtypes.bfloat16."""
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.uint16).numpy().view(BF16)
    return tensor.numpy()


class TorchScriptEngine:
    """``torch.jit.load``-ed module; blocking, one caller thread."""

    platform = "pytorch_libtorch"

    def __init__(
        self,
        path: str | Path,
        *,
        name: str,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        max_batch_size: int,
        device: str = "auto",
        batched: bool = True,
        threads: int | None = None,
    ) -> None:
        path = Path(path)
        if not path.is_file():
            raise EngineUnavailable(f"TorchScript file {path} does not exist")
        if not inputs or not outputs:
            raise EngineUnavailable(
                f"{name}: a TorchScript model needs its inputs and outputs in config.pbtxt"
            )
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.max_batch_size = int(max_batch_size)
        self.batch_sizes: list[int] | None = None
        self.batched = batched
        self._device = resolve_device(device)
        self.device = str(self._device)
        if threads is not None and self._device.type == "cpu":
            torch.set_num_threads(threads)
        try:
            self.model = torch.jit.load(str(path), map_location=self._device).eval()
        except Exception as exc:  # torch raises RuntimeError/ValueError for non-TorchScript files
            raise EngineUnavailable(f"{path} is not a TorchScript module: {exc}") from exc
        self._in_order = triton_order(self.inputs)
        self._out_order = triton_order(self.outputs)
        log.info("TorchScript %s on %s", path, self.device)

    def _forward(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        out = self.model(*tensors)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(self._out_order):
            raise EngineError(f"{self.name}: model returned {len(outs)} outputs, config declares "
                              f"{len(self._out_order)}")  # fmt: skip
        return outs

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        try:
            arrays = [np.ascontiguousarray(batch[s.name], dtype=s.dtype) for s in self._in_order]
        except KeyError as exc:
            raise EngineError(f"{self.name}: missing input {exc}") from exc
        with torch.inference_mode():
            if self.batched:
                outs = self._forward([to_torch(a).to(self._device) for a in arrays])
                results = [to_numpy(o) for o in outs]
            else:  # max_batch_size 0: the model takes one request at a time, no batch axis
                rows = [
                    [to_numpy(o) for o in self._forward([to_torch(a[i]).to(self._device) for a in arrays])]
                    for i in range(len(arrays[0]))
                ]
                results = [np.stack(col) for col in zip(*rows, strict=True)]
        return {
            spec.name: np.asarray(value, dtype=spec.dtype)
            for spec, value in zip(self._out_order, results, strict=True)
        }

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
