"""A stateful model's ``sequence_batching``, read as Triton reads it: the strategy's knobs,
the control inputs the server fills for every request, and the implicit state.

Control inputs (``control_input``) and state tensors are the model's inputs (and, for state,
outputs) that no client sends or receives: the config lists them here, not in ``input``,
and the server gives each request its values (``SequenceModelSpec.controls``): START and END
from the request's flags, READY true (every request in a batch is a real one), CORRID its
correlation ID, each in the data type and false/true values the config names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf import json_format
from wattserve.batchers.types import SequenceTag
from wattserve.engines.base import DATATYPE_TO_NUMPY, TensorSpec
from wattserve.server.models.repository import model_config_pb2 as pb
from wattserve.server.models.repository.config import ConfigError

MSB = pb.ModelSequenceBatching
KINDS = {
    MSB.Control.CONTROL_SEQUENCE_START: "start",
    MSB.Control.CONTROL_SEQUENCE_END: "end",
    MSB.Control.CONTROL_SEQUENCE_READY: "ready",
    MSB.Control.CONTROL_SEQUENCE_CORRID: "corrid",
}
CORRID_TYPES = {"UINT64", "INT64", "UINT32", "INT32", "STRING"}
DEFAULT_IDLE_US = 1_000_000  # Triton's max_sequence_idle_microseconds default


@dataclass(frozen=True)
class Control:
    """One control input: which flag it carries, its data type, and its false/true values
    (for CORRID: the correlation ID itself)."""

    name: str
    kind: str  # start, end, ready, corrid
    datatype: str
    values: tuple[Any, Any] = (0, 1)

    def value(self, tag: SequenceTag) -> Any:
        if self.kind == "corrid":
            cid = tag.correlation_id
            if self.datatype == "BYTES":
                return str(cid).encode()
            if isinstance(cid, str):
                raise ValueError(f"sequence {cid!r}: a string correlation ID for a model whose CORRID "
                                 f"control input {self.name!r} is TYPE_{self.datatype}")  # fmt: skip
            return cid
        on = {"start": tag.start, "end": tag.end, "ready": True}[self.kind]
        return self.values[1] if on else self.values[0]


@dataclass(frozen=True)
class ImplicitState:
    """One implicit state: the model's input that gets it and output that gives its next
    value, its spec (per row), and its initial value (one row: zeros, or a data file's)."""

    input_name: str
    output_name: str
    spec: TensorSpec
    initial_data: bytes | None = None  # row-major bytes (initial_state.data_file); None: zeros

    def initial(self) -> np.ndarray:
        """One row; a variable dimension is 1 in it (Triton's first request), the state taking
        the shape of the model's state output from then on."""
        shape = (1, *(1 if d < 0 else d for d in self.spec.shape))
        if self.initial_data is None and self.spec.datatype == "BYTES":  # zeros of a string: empty
            return np.full(shape, b"", dtype=object)
        if self.initial_data is None:
            return np.zeros(shape, dtype=self.spec.dtype)
        return np.frombuffer(self.initial_data, self.spec.dtype).reshape((1, *self.spec.shape)).copy()


@dataclass(frozen=True)
class SequenceModelSpec:
    """What the server needs of a config's ``sequence_batching``."""

    model: str
    controls: tuple[Control, ...]
    states: tuple[ImplicitState, ...]
    max_queue_delay_ms: float
    min_slot_utilization: float
    idle_s: float
    strategy: str = "direct"  # or "oldest"
    slots: int = 0  # oldest's max_candidate_sequences (0: max_batch_size)
    preferred_batch_sizes: tuple[int, ...] = ()  # oldest's

    def control_specs(self) -> list[TensorSpec]:
        return [TensorSpec(c.name, (1,), c.datatype) for c in self.controls]

    def hidden_inputs(self) -> list[TensorSpec]:
        """The model inputs no client sends: the controls and the state inputs."""
        return self.control_specs() + [TensorSpec(s.input_name, s.spec.shape, s.spec.datatype)
                                       for s in self.states]  # fmt: skip

    def hidden_outputs(self) -> list[TensorSpec]:
        return [TensorSpec(s.output_name, s.spec.shape, s.spec.datatype) for s in self.states]

    def not_ready(self) -> dict[str, np.ndarray]:
        """Each control input's one row for a null request in an idle slot (Triton's
        ``notready_input_overrides``): START, END and READY false, CORRID 0 (a string one empty)."""
        rows = {}
        for control in self.controls:
            dtype = DATATYPE_TO_NUMPY[control.datatype]
            corrid = b"" if np.dtype(dtype) == object else 0
            value = corrid if control.kind == "corrid" else control.values[0]
            rows[control.name] = np.full((1, 1), value, dtype=dtype)
        return rows

    def admit(
        self, tag: SequenceTag | None, rows: int, inputs: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """A request's inputs with its control tensors (``rows`` rows: always 1), or the
        refusal Triton gives (ValueError: 400)."""
        if rows > 1:
            raise ValueError(f"inference request to model '{self.model}' must specify batch-size 1 due to "
                             "requirements of sequence batcher")  # fmt: skip
        if tag is None:
            raise ValueError(f"inference request to model '{self.model}' must specify a non-zero or "
                             "non-empty correlation ID")  # fmt: skip
        out = dict(inputs)
        for control in self.controls:
            dtype = DATATYPE_TO_NUMPY[control.datatype]
            try:
                out[control.name] = np.full((1, 1), control.value(tag), dtype=dtype)
            except OverflowError:  # a correlation ID the CORRID data type cannot hold
                raise ValueError(f"sequence {tag.correlation_id}: the correlation ID does not fit the "
                                 f"CORRID control input {control.name!r} (TYPE_{control.datatype})"
                                 ) from None  # fmt: skip
        return out


def sequence_spec(config: pb.ModelConfig, name: str, source: str, model_dir: Path) -> SequenceModelSpec:
    """The config's ``sequence_batching``, checked as Triton checks it (ConfigError naming the
    field); a state's ``initial_state.data_file`` is read from ``<model_dir>/initial_state/``."""
    sb = config.sequence_batching
    where = f"{source}: sequence_batching"
    controls: list[Control] = []
    seen: set[str] = set()
    for i, entry in enumerate(sb.control_input):
        if not entry.name:
            raise ConfigError(f"{where}.control_input[{i}] has no name")
        if len(entry.control) != 1:
            raise ConfigError(f"{where}.control_input[{i}] ({entry.name}) must have exactly one control "
                              f"(has {len(entry.control)})")  # fmt: skip
        control = _control(entry.name, entry.control[0], f"{where}.control_input[{i}] ({entry.name})")
        if control.kind in seen:
            raise ConfigError(
                f"{where}: more than one control input for CONTROL_SEQUENCE_{control.kind.upper()}"
            )
        seen.add(control.kind)
        controls.append(control)
    states = [_state(s, f"{where}.state[{i}]", model_dir) for i, s in enumerate(sb.state)]
    idle_s = (sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US) / 1e6
    if sb.WhichOneof("strategy_choice") == "oldest":
        oldest = sb.oldest
        if oldest.max_candidate_sequences < 0:
            raise ConfigError(f"{where}.oldest.max_candidate_sequences must be >= 0")
        preferred = tuple(int(s) for s in oldest.preferred_batch_size)
        if any(not 1 <= s <= max(1, config.max_batch_size) for s in preferred):
            raise ConfigError(f"{where}.oldest.preferred_batch_size {list(preferred)}: each must be "
                              f"within 1..max_batch_size ({config.max_batch_size})")  # fmt: skip
        delay_ms = oldest.max_queue_delay_microseconds / 1000.0
        return SequenceModelSpec(name, tuple(controls), tuple(states), delay_ms, 0.0, idle_s, "oldest",
                                 oldest.max_candidate_sequences, preferred)  # fmt: skip
    direct = sb.direct  # Triton's default strategy
    utilization = float(direct.minimum_slot_utilization)
    if not 0.0 <= utilization <= 1.0:
        raise ConfigError(f"{where}.direct.minimum_slot_utilization must be within 0..1, got {utilization}")
    delay_ms = direct.max_queue_delay_microseconds / 1000.0
    return SequenceModelSpec(name, tuple(controls), tuple(states), delay_ms, utilization, idle_s)


def _datatype(value: pb.DataType.ValueType) -> str:
    name = pb.DataType.Name(value).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _control(name: str, control: Any, where: str) -> Control:
    kind = KINDS[control.kind]
    if kind == "corrid":
        datatype = _datatype(control.data_type)
        if datatype.replace("BYTES", "STRING") not in CORRID_TYPES:
            got = pb.DataType.Name(control.data_type)
            raise ConfigError(f"{where}: CONTROL_SEQUENCE_CORRID needs data_type TYPE_UINT64, TYPE_INT64, "
                              f"TYPE_UINT32, TYPE_INT32 or TYPE_STRING (got {got})")  # fmt: skip
        return Control(name, kind, datatype)
    given = [
        (field, datatype, tuple(getattr(control, field)))
        for field, datatype in (
            ("int32_false_true", "INT32"),
            ("fp32_false_true", "FP32"),
            ("bool_false_true", "BOOL"),
        )
        if len(getattr(control, field))
    ]
    if len(given) != 1:
        raise ConfigError(f"{where}: CONTROL_SEQUENCE_{kind.upper()} needs exactly one of int32_false_true, "
                          "fp32_false_true or bool_false_true")  # fmt: skip
    field, datatype, values = given[0]
    if len(values) != 2:
        raise ConfigError(f"{where}: {field} must have two values (false, true), got {len(values)}")
    return Control(name, kind, datatype, (values[0], values[1]))


def _state(state: Any, where: str, model_dir: Path) -> ImplicitState:
    if not state.input_name or not state.output_name:
        raise ConfigError(f"{where} needs input_name and output_name")
    dims = tuple(int(d) for d in state.dims)
    datatype = _datatype(state.data_type)
    if datatype not in DATATYPE_TO_NUMPY:
        got = pb.DataType.Name(state.data_type)
        raise ConfigError(f"{where} ({state.input_name}): data_type {got} is not supported for implicit "
                          "state")  # fmt: skip
    spec = TensorSpec(state.input_name, dims, datatype)
    if len(state.initial_state) > 1:
        raise ConfigError(f"{where} ({state.input_name}): one initial_state at most")
    data = None
    for initial in state.initial_state:
        if tuple(initial.dims) != dims or initial.data_type != state.data_type:
            raise ConfigError(f"{where}.initial_state[0] must have the state's data_type and dims")
        choice = initial.WhichOneof("state_data")
        if choice is None:
            raise ConfigError(f"{where}.initial_state[0] needs zero_data or data_file")
        if choice == "data_file" and datatype == "BYTES":
            raise ConfigError(f"{where}.initial_state[0]: data_file for a TYPE_STRING state is not "
                              "supported by wattserve (zero_data is: empty strings)")  # fmt: skip
        if choice == "data_file" and any(d < 0 for d in dims):
            raise ConfigError(f"{where}.initial_state[0]: data_file for a state with variable dims "
                              f"{list(dims)} is not supported by wattserve (zero_data is)")  # fmt: skip
        if choice == "data_file":
            data = _initial_data(
                model_dir / "initial_state" / initial.data_file, spec, f"{where}.initial_state[0]"
            )
    return ImplicitState(state.input_name, state.output_name, spec, data)


def _initial_data(path: Path, spec: TensorSpec, where: str) -> bytes:
    """A data file's bytes: exactly one row of the state, row-major (Triton's rule)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: data_file {path}: {exc.strerror or exc}") from None
    expected = spec.element_count * spec.dtype.itemsize
    if len(data) != expected:
        raise ConfigError(f"{where}: data_file {path} has {len(data)} bytes; the state "
                          f"(TYPE_{spec.datatype} {list(spec.shape)}) takes {expected}")  # fmt: skip
    return data


def sequence_batching_doc(config: Any) -> dict[str, Any]:
    """A model config's ``sequence_batching`` as Triton's JSON writes it (64-bit integers as
    strings), for the configuration documents (the core knows no protobuf)."""
    return json_format.MessageToDict(config.sequence_batching, preserving_proto_field_name=True)
