"""A user's TorchScript file (``model.pt``), as Triton's pytorch_libtorch backend serves it.

TorchScript carries no tensor names or shapes, so they come from the model's config:
inputs are passed to ``forward`` positionally and outputs read back positionally, ordered
by Triton's ``NAME__<index>`` suffix when every name has one, else by config order.

BYTES (TYPE_STRING) tensors follow Triton's libtorch backend: a string input reaches
``forward`` as one flat ``List[str]`` (every element of every request in the batch, in
row-major order; Triton's ``SetStringInputTensor``), and a ``List[str]`` the model returns
is a BYTES output, its elements laid out over the batch and the config's dims (Triton
answers shape ``[len(list)]``, or ``[batch]`` for a batching model).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from wattserve.engines.base import BF16, VARIABLE, Batch, EngineError, EngineUnavailable, TensorSpec
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


def to_strings(array: np.ndarray, name: str) -> list[str]:
    """A BYTES array (``bytes`` elements) as the flat ``List[str]`` TorchScript takes;
    TorchScript strings are text, so each element must be UTF-8."""
    try:
        return [v.decode() if isinstance(v, (bytes, bytearray)) else str(v) for v in array.ravel()]
    except UnicodeDecodeError:
        raise ValueError(f"input {name!r}: TorchScript string inputs (List[str]) take UTF-8 text "
                         "only") from None  # fmt: skip


def from_strings(values: list[Any], spec: TensorSpec, lead: tuple[int, ...], model: str) -> np.ndarray:
    """A ``List[str]`` the model returned -> an object array of ``bytes`` shaped
    ``lead + spec.shape`` (one -1 there takes what is left)."""
    if spec.datatype != "BYTES":
        raise EngineError(
            f"{model}: output {spec.name!r} is a List[str], config declares TYPE_{spec.datatype}"
        )
    if not all(isinstance(v, str) for v in values):
        raise EngineError(f"{model}: output {spec.name!r} must be a Tensor or List[str]")
    out = np.empty(len(values), dtype=object)
    out[:] = [v.encode() for v in values]
    shape = (*lead, *spec.shape)
    if list(spec.shape).count(VARIABLE) <= 1:
        try:
            return out.reshape(shape)
        except ValueError:
            pass
    raise EngineError(f"{model}: output {spec.name!r} has {len(values)} strings, which do not fill "
                      f"shape {list(shape)}")  # fmt: skip


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

    def validate(self, inputs: Mapping[str, np.ndarray]) -> None:
        """A request's BYTES inputs must be UTF-8 (TorchScript's ``str``): a 400, not a failed
        batch."""
        for spec in self._in_order:
            if spec.datatype == "BYTES" and spec.name in inputs:
                to_strings(inputs[spec.name], spec.name)

    def _feed(self, array: np.ndarray, spec: TensorSpec) -> torch.Tensor | list[str]:
        if spec.datatype == "BYTES":
            return to_strings(array, spec.name)
        return to_torch(array).to(self._device)

    def _forward(self, args: list[Any], lead: tuple[int, ...]) -> list[np.ndarray]:
        """One model call; outputs as numpy, BYTES ones shaped ``lead + dims``."""
        out = self.model(*args)
        outs = list(out) if isinstance(out, tuple) else [out]
        if len(outs) != len(self._out_order):
            raise EngineError(f"{self.name}: model returned {len(outs)} outputs, config declares "
                              f"{len(self._out_order)}")  # fmt: skip
        results = []
        for spec, value in zip(self._out_order, outs, strict=True):
            if isinstance(value, torch.Tensor):
                if spec.datatype == "BYTES":
                    raise EngineError(f"{self.name}: output {spec.name!r} is a Tensor, config declares "
                                      "TYPE_STRING (return a List[str])")  # fmt: skip
                results.append(to_numpy(value))
            elif isinstance(value, list):
                results.append(from_strings(value, spec, lead, self.name))
            else:
                raise EngineError(f"{self.name}: output {spec.name!r} must be a Tensor or List[str], "
                                  f"model returned {type(value).__name__}")  # fmt: skip
        return results

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        try:
            arrays = [np.ascontiguousarray(batch[s.name], dtype=s.dtype) for s in self._in_order]
        except KeyError as exc:
            raise EngineError(f"{self.name}: missing input {exc}") from exc
        specs = self._in_order
        try:
            with torch.inference_mode():
                if self.batched:
                    rows = len(arrays[0])
                    results = self._forward(
                        [self._feed(a, s) for a, s in zip(arrays, specs, strict=True)], (rows,)
                    )
                else:  # max_batch_size 0: the model takes one request at a time, no batch axis
                    per_item = [
                        self._forward([self._feed(a[i], s) for a, s in zip(arrays, specs, strict=True)], ())
                        for i in range(len(arrays[0]))
                    ]
                    results = [np.stack(col) for col in zip(*per_item, strict=True)]
        except ValueError as exc:  # a non-UTF-8 string validate() did not see
            raise EngineError(f"{self.name}: {exc}") from exc
        return {
            spec.name: np.asarray(value, dtype=spec.dtype)
            for spec, value in zip(self._out_order, results, strict=True)
        }

    def close(self) -> None:
        # Drop the weights; no call follows close() (the Engine contract), so the attribute
        # keeps the live model's type rather than an Optional every call must test.
        self.model = None  # type: ignore[assignment]
