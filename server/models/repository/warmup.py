"""Triton's ``model_warmup``: the config's own samples, run on every instance before READY.

Each sample is one request of ``batch_size`` rows (1 for a model without batching) whose
inputs are zeros, random values, or a file under ``<model>/warmup/`` (raw row-major bytes
of one batch element; BYTES elements each behind a 4-byte length, the wire form), that
element repeated for every row, as Triton builds them. ``count`` runs it that many times
(0: once). The samples are read when the model is planned (a bad sample fails the load
naming it) and run by the engine factory, on the instance's own thread, right after it is
built: a sample that fails leaves the model UNAVAILABLE with the reason.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from wattserve.engines.base import DATATYPE_TO_NUMPY, Engine, EngineUnavailable
from wattserve.engines.config import EngineConfig
from wattserve.engines.request_engines import RunsRequests
from wattserve.server.core.bytes_tensors import BytesTensorError, deserialize_bytes
from wattserve.server.models.plan import EngineFactory
from wattserve.server.models.repository import model_config_pb2 as pb
from wattserve.server.models.repository.config import ConfigError

WARMUP_DIR = "warmup"  # Triton's: input_data_file is read from <model>/warmup/

log = logging.getLogger("wattserve.warmup")
# a decoupled model's sample is done at its final response (Triton waits for it without a
# bound; a model that never sends one fails its load after this long instead of hanging it)
DECOUPLED_FINAL_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class WarmupSample:
    """One ``model_warmup`` entry, ready to run: its inputs carry the batch axis."""

    label: str  # model_warmup[i] ('name'), for messages
    inputs: Mapping[str, np.ndarray]
    count: int  # executions (Triton's count; 0 means once)
    name: str = ""  # the sample's own name, as Triton's log lines and errors give it


def warmup_samples(config: pb.ModelConfig, model_dir: Path, source: str) -> list[WarmupSample]:
    """The config's samples, checked and filled with their data."""
    batching = config.max_batch_size > 0
    declared = {t.name for t in config.input}
    if config.WhichOneof("scheduling_choice") == "sequence_batching":
        # a stateful model's control and state inputs are model inputs no client sends; a
        # sample sets them (Triton's L0_warmup warms a sequence model with START and READY)
        declared |= {c.name for c in config.sequence_batching.control_input}
        declared |= {s.input_name for s in config.sequence_batching.state}
    rng = np.random.default_rng(0)
    samples = []
    for i, warm in enumerate(config.model_warmup):
        label = f"model_warmup[{i}] ('{warm.name}')"
        rows = warm.batch_size if batching else 1
        if batching and not 1 <= warm.batch_size <= config.max_batch_size:
            raise ConfigError(f"{source}: {label}: batch_size {warm.batch_size} must be 1..max_batch_size "
                              f"({config.max_batch_size})")  # fmt: skip
        if not batching and warm.batch_size > 1:
            raise ConfigError(f"{source}: {label}: batch_size {warm.batch_size} for a model without "
                              "batching (max_batch_size 0): it must be 0 or 1")  # fmt: skip
        if not warm.inputs:
            raise ConfigError(f"{source}: {label}: no inputs")
        inputs = {}
        for name, spec in warm.inputs.items():
            where = f"{source}: {label} input '{name}'"
            if declared and name not in declared:
                raise ConfigError(f"{where}: not an input of the model ({', '.join(sorted(declared))})")
            one = _element(spec, model_dir, where, rng)
            inputs[name] = np.repeat(one[np.newaxis], rows, axis=0)  # every row the same element
        samples.append(WarmupSample(label, inputs, max(1, warm.count), warm.name))
    return samples


def _element(spec: pb.ModelWarmup.Input, model_dir: Path, where: str, rng: np.random.Generator) -> np.ndarray:
    """One batch element of a sample's input, as its data choice says."""
    type_name = pb.DataType.Name(spec.data_type).removeprefix("TYPE_")
    datatype = "BYTES" if type_name == "STRING" else type_name
    if datatype not in DATATYPE_TO_NUMPY:
        raise ConfigError(f"{where}: data_type TYPE_{type_name} is not supported")
    dtype = DATATYPE_TO_NUMPY[datatype]
    dims = tuple(int(d) for d in spec.dims)
    if any(d < 0 for d in dims):
        raise ConfigError(f"{where}: dims {list(dims)} must be sizes (>= 0), not variable")
    choice = spec.WhichOneof("input_data_type")
    if choice is None:
        raise ConfigError(f"{where}: set one of zero_data, random_data or input_data_file")
    if datatype == "BYTES" and choice != "input_data_file":
        return np.full(dims, b"", dtype=object)  # Triton's zero (and random) strings: empty elements
    if choice == "zero_data":
        return np.zeros(dims, dtype)
    if choice == "random_data":
        if np.dtype(dtype).kind == "f":
            return rng.random(dims).astype(dtype)
        if np.dtype(dtype).kind == "b":
            return rng.integers(0, 2, dims).astype(dtype)
        return rng.integers(0, 100, dims).astype(dtype)  # within every integer type
    path = model_dir / WARMUP_DIR / spec.input_data_file
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: input_data_file {path}: {exc.strerror or exc}") from None
    if datatype == "BYTES":
        try:
            return deserialize_bytes(data, spec.input_data_file, dims)
        except BytesTensorError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    need = math.prod(dims) * np.dtype(dtype).itemsize
    if len(data) < need:
        raise ConfigError(f"{where}: warmup setting expects {need} bytes, but the data provided from "
                          f"{spec.input_data_file} only has {len(data)} bytes")  # fmt: skip
    return np.frombuffer(data[:need], dtype=dtype).reshape(dims).copy()


def warmed(factory: EngineFactory, samples: list[WarmupSample], decoupled: bool = False) -> EngineFactory:
    """``factory`` whose every instance runs ``samples`` once built (on its own thread,
    before the model is READY); a failing sample fails the instance's load, naming it.
    Each run and each failure is logged in Triton's words (its ``--log-verbose=1`` lines:
    "model 'M' instance I is running warmup sample 'S' for iteration N", "failed to run
    warmup sample 'S': ERROR; "), which Triton's ``qa/L0_warmup`` looks for. A decoupled
    model's sample is a request with a response sender: it is done at the final response,
    zero or more responses before it (Triton's), and failed by any response's error."""
    if not samples:
        return factory

    def build(engine_config: EngineConfig) -> Engine:
        engine = factory(engine_config)
        instance = f"on {getattr(engine, 'device', engine_config.device)}"
        for sample in samples:
            for iteration in range(1, sample.count + 1):
                log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d",
                          engine_config.model, instance, sample.name, iteration)  # fmt: skip
                try:
                    if decoupled and isinstance(engine, RunsRequests):
                        _run_decoupled(engine, sample)
                    else:
                        engine.infer(dict(sample.inputs))
                except Exception as exc:
                    close = getattr(engine, "close", None)
                    if close is not None:
                        close()
                    reason = f"{sample.label} failed: failed to run warmup sample '{sample.name}': {exc}; "
                    log.error("model '%s' instance %s: %s", engine_config.model, instance, reason)
                    raise EngineUnavailable(reason) from exc
        return engine

    return build


def _run_decoupled(engine: RunsRequests, sample: WarmupSample) -> None:
    """One sample through a decoupled model's response sender; raises with the responses'
    errors (joined by "; ", as Triton joins them) or when no final response comes."""
    final = threading.Event()
    errors: list[str] = []

    def sink(_outputs: object, error: BaseException | None, last: bool) -> None:
        if error is not None:
            errors.append(str(error))
        if last:
            final.set()

    context = SimpleNamespace(id="", outputs=None, parameters=None, sequence=None, response_sink=sink,
                              response_cancelled=None)  # fmt: skip
    (answer,) = engine.run_requests([(dict(sample.inputs), context, bool)])
    if isinstance(answer, BaseException):
        raise answer
    if not final.wait(DECOUPLED_FINAL_TIMEOUT_S):
        raise TimeoutError(f"no final response within {DECOUPLED_FINAL_TIMEOUT_S:g} s")
    if errors:
        raise RuntimeError("; ".join(errors))
