"""ONNX Runtime engine: the exported model on CPU, or on CUDA with onnxruntime-gpu.

Same contract as the torch engine (input "input" FP32 [3,224,224], output "logits" FP32
[1000]); any batch size 1..max_batch_size runs as is, so ``batch_sizes`` is None.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from wattserve.engines.base import BF16, VARIABLE, Batch, EngineError, EngineUnavailable, TensorSpec
from wattserve.engines.config import EngineConfig

log = logging.getLogger(__name__)

# ONNX Runtime's element type strings -> KServe datatypes: every Triton datatype ONNX has
# (BYTES, ONNX's string, is the codec's: numpy object arrays of bytes).
_ORT_TYPES = {
    "tensor(float)": "FP32",
    "tensor(float16)": "FP16",
    "tensor(bfloat16)": "BF16",
    "tensor(double)": "FP64",
    "tensor(int64)": "INT64",
    "tensor(int32)": "INT32",
    "tensor(int16)": "INT16",
    "tensor(int8)": "INT8",
    "tensor(uint64)": "UINT64",
    "tensor(uint32)": "UINT32",
    "tensor(uint16)": "UINT16",
    "tensor(uint8)": "UINT8",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}
_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16: ONNX Runtime's element type number


def _import_ort():
    try:
        import onnxruntime
    except ImportError as exc:
        raise EngineUnavailable(
            "onnxruntime is not installed (pip install 'wattserve[onnx]', or onnxruntime-gpu for CUDA)"
        ) from exc
    return onnxruntime


def resolve_providers(device: str, available: Sequence[str]) -> tuple[list, str]:
    """Execution providers for ``device`` and the device string to report.

    ``auto`` takes CUDA when onnxruntime-gpu offers it, else CPU; an explicit ``cuda[:N]``
    without the CUDA provider is an error rather than a silent fall-back to CPU.
    """
    device = device.lower()
    has_cuda = "CUDAExecutionProvider" in available
    if device == "auto":
        device = "cuda" if has_cuda and _cuda_device_present() else "cpu"
    if device == "cpu":
        return ["CPUExecutionProvider"], "cpu"
    if device.startswith("cuda"):
        if not has_cuda:
            raise EngineUnavailable(
                f"device {device!r} asked for, but this onnxruntime has no CUDAExecutionProvider "
                f"(available: {', '.join(available)}); install onnxruntime-gpu"
            )
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        cuda = ("CUDAExecutionProvider", {"device_id": index})
        return [cuda, "CPUExecutionProvider"], f"cuda:{index}"
    raise EngineUnavailable(f"unknown device {device!r} (auto, cpu, cuda, cuda:N)")


def _cuda_device_present() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a core dependency
        return False


def session_options(threads: int | None, spin: bool = False):
    """Session options tuned for one engine instance per worker thread.

    - full graph optimizations (constant folding, conv+activation fusion, layout transforms);
    - sequential execution: these CNNs are chains, parallel branches buy nothing;
    - intra-op threads = ``threads`` or every core; one inter-op thread;
    - spinning off: ORT's worker threads otherwise busy-wait between batches, burning a core
      (and watts) while idle and stealing CPU from the event loop; measured cost on this
      machine is in benchmarks/engines_cpu.py (``--spin``).
    """
    ort = _import_ort()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.intra_op_num_threads = threads or (os.cpu_count() or 1)
    opts.inter_op_num_threads = 1
    opts.enable_cpu_mem_arena = True
    opts.enable_mem_pattern = True
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return opts


class OnnxRuntimeEngine:
    """One ONNX Runtime session over an exported model; blocking, one worker thread."""

    platform = "onnxruntime"

    def __init__(
        self,
        onnx_path: str | Path,
        *,
        name: str,
        max_batch_size: int,
        device: str = "auto",
        threads: int | None = None,
        spin: bool = False,
        batched: bool = True,
        optional: Sequence[str] = (),
    ) -> None:
        """``optional``: inputs a request may leave out (Triton's ``optional: true``); each
        must be a graph input with a default (an initializer of that name), which ONNX Runtime
        uses when the input is not fed."""
        ort = _import_ort()
        path = Path(onnx_path)
        if not path.exists():
            raise EngineUnavailable(f"ONNX file {path} does not exist (run `wattserve export`)")
        providers, self.device = resolve_providers(device, ort.get_available_providers())
        self.name = name
        self.max_batch_size = int(max_batch_size)
        self.batch_sizes: Sequence[int] | None = None
        self.onnx_path = path
        self._session = ort.InferenceSession(
            str(path), sess_options=session_options(threads, spin), providers=providers
        )
        self.providers = self._session.get_providers()
        if self.device.startswith("cuda") and "CUDAExecutionProvider" not in self.providers:
            raise EngineUnavailable(f"CUDAExecutionProvider failed to load for {path}")
        # batched=False (Triton max_batch_size 0): the graph has no batch axis; the batcher's
        # batches (of one, from a runtime that does not batch) are run row by row.
        self.batched = batched
        self.inputs = [_spec(i, batched=batched) for i in self._session.get_inputs()]
        self.inputs += self._optional_inputs(optional, batched)
        self.outputs = [_spec(o, batched=batched) for o in self._session.get_outputs()]
        self._output_names = [o.name for o in self.outputs]
        self._dtypes = {s.name: s.dtype for s in self.inputs}
        self._optional = {s.name for s in self.inputs if s.optional}
        self._string_inputs = [s.name for s in self.inputs if s.datatype == "BYTES"]
        self._string_outputs = [s.name for s in self.outputs if s.datatype == "BYTES"]
        # ONNX Runtime's numpy bridge has no bfloat16: a model with a BF16 tensor runs
        # through OrtValues built from (and read back as) the raw 16-bit words.
        self._bf16 = any(s.datatype == "BF16" for s in (*self.inputs, *self.outputs))
        log.info("onnxruntime %s on %s via %s", path.name, self.device, self.providers)

    @classmethod
    def from_config(cls, config: EngineConfig) -> OnnxRuntimeEngine:
        """Build from a model's engine configuration, exporting the ONNX file first if needed."""
        from wattserve.engines.onnx_export import ensure_onnx

        return cls(
            ensure_onnx(config),
            name=config.model,
            max_batch_size=config.max_batch_size,
            device=config.device,
            threads=config.torch_threads,
        )

    def _optional_inputs(self, names: Sequence[str], batched: bool) -> list[TensorSpec]:
        """The specs of the optional inputs: the graph's inputs with a default value."""
        required = {s.name for s in self.inputs}
        defaults = {i.name: i for i in self._session.get_overridable_initializers()}
        specs = []
        for name in names:
            if name in required:
                raise EngineUnavailable(f"{self.name}: input {name!r} is optional in the config but the "
                                        "model requires it (only an input with a default, an initializer "
                                        "of that name, may be left out)")  # fmt: skip
            if name in defaults:
                specs.append(replace(_spec(defaults[name], batched=batched), optional=True))
        return specs  # a name the model lacks: the config check names it

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        feeds = {}
        for name, dtype in self._dtypes.items():
            if name not in batch:
                if name in self._optional:
                    continue  # left out by the request: the graph's default
                raise EngineError(f"{self.name}: missing input {name!r}")
            arr = batch[name]
            if arr.shape[0] > self.max_batch_size:
                raise EngineError(
                    f"{self.name}: batch of {arr.shape[0]} exceeds max_batch_size {self.max_batch_size}"
                )
            feeds[name] = np.ascontiguousarray(arr, dtype=dtype)
        for name in self._string_inputs:
            if name in feeds:
                feeds[name] = _to_ort_strings(feeds[name])
        try:
            if self.batched:
                results = self._run(feeds)
            else:
                rows = [self._run({k: v[i, ...] for k, v in feeds.items()})
                        for i in range(len(next(iter(feeds.values()))))]  # fmt: skip
                results = [np.stack(col) for col in zip(*rows, strict=True)]
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidArgument types
            raise EngineError(f"{self.name}: onnxruntime failed: {exc}") from exc
        outputs = dict(zip(self._output_names, results, strict=True))
        for name in self._string_outputs:
            outputs[name] = _from_ort_strings(outputs[name])
        return outputs

    def validate(self, inputs: dict[str, np.ndarray]) -> None:
        """A request's BYTES inputs must be UTF-8: ONNX Runtime's strings are (a 400, not a
        failed batch)."""
        for name in self._string_inputs:
            for value in inputs[name].ravel() if name in inputs else ():
                try:
                    value.decode()
                except UnicodeDecodeError:
                    raise ValueError(f"input {name!r}: ONNX Runtime string tensors take UTF-8 text "
                                     "only") from None  # fmt: skip

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if not self._bf16:
            return self._session.run(self._output_names, feeds)
        ort = _import_ort()
        values = {
            name: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint16), _ONNX_BFLOAT16)
            if a.dtype == BF16
            else ort.OrtValue.ortvalue_from_numpy(a)
            for name, a in feeds.items()
        }
        outs = self._session.run_with_ort_values(self._output_names, values)
        return [_bf16_array(v) if v.data_type() == "tensor(bfloat16)" else v.numpy() for v in outs]

    def close(self) -> None:
        self._session = None


def _bf16_array(value) -> np.ndarray:
    """A BF16 OrtValue (in host memory, where run_with_ort_values leaves outputs) copied
    out as an ml_dtypes.bfloat16 array: OrtValue.numpy() refuses bfloat16."""
    if value.device_name().lower() != "cpu":
        raise EngineError(f"BF16 output on {value.device_name()}; only host outputs can be read")
    raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
    return np.frombuffer(raw, dtype=BF16).reshape(value.shape())


def _spec(node, batched: bool = True) -> TensorSpec:
    """TensorSpec (shape without the batch axis, unless not ``batched``) from a NodeArg."""
    try:
        datatype = _ORT_TYPES[node.type]
    except KeyError as exc:
        raise EngineUnavailable(f"tensor {node.name} has unsupported type {node.type}") from exc
    dims = node.shape[1:] if batched else node.shape
    # A symbolic or unknown dimension is a variable one (-1): each request gives its size.
    shape = tuple(d if isinstance(d, int) and d >= 0 else VARIABLE for d in dims)
    return TensorSpec(node.name, shape, datatype)


def _to_ort_strings(array: np.ndarray) -> np.ndarray:
    """BYTES elements (``bytes``) as the ``str`` ONNX Runtime takes (it str()-ifies bytes);
    ``validate`` has checked they are UTF-8."""
    return np.array([v.decode() if isinstance(v, bytes) else str(v) for v in array.ravel()],
                    dtype=object).reshape(array.shape)  # fmt: skip


def _from_ort_strings(array: np.ndarray) -> np.ndarray:
    return np.array([v.encode() if isinstance(v, str) else bytes(v) for v in array.ravel()],
                    dtype=object).reshape(array.shape)  # fmt: skip
