"""Read one model's ``config.pbtxt`` as Triton reads it, and refuse what wattserve does not run.

The text is parsed by protobuf's own text format against Triton's ``ModelConfig`` message
(vendored generated module), never by hand: an unknown field or a syntax error is a
``ConfigError`` that names the file, the line and protobuf's own words for the field. A
field wattserve does not implement fails the load naming it (``check_supported``), unless
the user allows it (``--allow-unsupported-config``): then it is cleared, with a warning, so
that the model and ``/config`` see exactly what runs. Nothing in a config is dropped in
silence.
"""

from __future__ import annotations

import re
from pathlib import Path

from google.protobuf import text_format
from google.protobuf.message import Message
from wattserve.server.models.repository import model_config_pb2 as pb

CONFIG_FILE = "config.pbtxt"

# Every config.pbtxt field wattserve honours, with Triton's meaning. A field set in a
# config and absent here is refused at load (``check_supported``); tests/test_unsupported_config.py
# walks every field of the proto against this table.
HONOURED: dict[str, set[str]] = {
    "ModelConfig": {
        "name", "platform", "backend", "version_policy", "max_batch_size", "input", "output",
        "dynamic_batching", "instance_group", "parameters", "default_model_filename",
        "model_warmup",  # server/models/repository/warmup.py
    },
    "ModelInput": {"name", "data_type", "format", "dims", "reshape"},  # format: checked, reported
    "ModelOutput": {"name", "data_type", "dims", "reshape", "label_filename"},  # labels: classification
    "ModelTensorReshape": {"shape"},
    "ModelDynamicBatching": {
        "preferred_batch_size", "max_queue_delay_microseconds", "priority_levels",
        "default_priority_level", "default_queue_policy", "priority_queue_policy", "preserve_ordering",
    },
    "ModelQueuePolicy": {
        "timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size",
    },
    "ModelInstanceGroup": {"name", "count", "kind", "gpus", "rate_limiter"},
    # Triton's rate limiter (batchers/rate_limiter.py), used with --rate-limit execution_count
    "ModelRateLimiter": {"resources", "priority"},
    "Resource": {"name", "global", "count"},
    "ModelVersionPolicy": {"latest", "all", "specific"},
    "Latest": {"num_versions"},
    "All": set(),
    "Specific": {"versions"},
    "ParametersEntry": {"key", "value"},
    "ModelParameter": {"string_value"},
    "ModelWarmup": {"name", "batch_size", "inputs", "count"},  # inputs: a map, its entries whole
}  # fmt: skip
# ... and those honoured only by one kind of model (plan.PLATFORMS' kinds)
HONOURED_BY_KIND: dict[str, dict[str, set[str]]] = {
    "python": {
        "ModelConfig": {"model_transaction_policy"},
        "ModelTransactionPolicy": {"decoupled"},
        "ModelInput": {"optional"},  # the model's request lacks the input: get_input_tensor_by_name None
    },
    "onnx": {"ModelInput": {"optional"}},  # not fed: the graph's default (an initializer)
    "ensemble": {  # server/models/ensemble_graph.py
        "ModelConfig": {"ensemble_scheduling"},
        "ModelInput": {"optional"},  # left out: absent for the steps that read it (their inputs optional too)
        "ModelEnsembling": {"step"},
        "Step": {"model_name", "model_version", "input_map", "output_map"},
    },
}
# Triton's sequence batcher (batchers/sequence.py, server/models/repository/sequence_config.py):
# the direct and oldest strategies and the control inputs for ONNX Runtime, TorchScript and Python
# models, implicit state for ONNX Runtime and TorchScript models
SEQUENCE_BATCHING: dict[str, set[str]] = {
    "ModelConfig": {"sequence_batching"},
    "ModelSequenceBatching": {"direct", "oldest", "max_sequence_idle_microseconds", "control_input"},
    "StrategyDirect": {"max_queue_delay_microseconds", "minimum_slot_utilization"},
    "StrategyOldest": {"max_candidate_sequences", "preferred_batch_size", "max_queue_delay_microseconds"},
    "ControlInput": {"name", "control"},
    "Control": {"kind", "int32_false_true", "fp32_false_true", "bool_false_true", "data_type"},
}
IMPLICIT_STATE: dict[str, set[str]] = {
    "ModelSequenceBatching": {"state"},
    "State": {"input_name", "output_name", "data_type", "dims", "initial_state"},
    "InitialState": {"data_type", "dims", "zero_data", "data_file", "name"},
}
for _kind, _parts in (
    ("onnx", (SEQUENCE_BATCHING, IMPLICIT_STATE)),
    ("torchscript", (SEQUENCE_BATCHING, IMPLICIT_STATE)),
    ("python", (SEQUENCE_BATCHING,)),
):
    _own = HONOURED_BY_KIND.setdefault(_kind, {})
    for _part in _parts:
        for _message, _fields in _part.items():
            _own.setdefault(_message, set()).update(_fields)
# Triton's response cache (server/models/response_cache.py), for every kind with an engine and
# for an ensemble's own requests (a hit skips its steps; its steps' models may cache theirs)
for _kind in ("onnx", "torchscript", "tensorrt", "builtin", "python", "ensemble"):
    _own = HONOURED_BY_KIND.setdefault(_kind, {})
    _own.setdefault("ModelConfig", set()).add("response_cache")
    _own["ModelResponseCache"] = {"enable"}
# Triton's ragged batching (engines/ragged.py, server/models/repository/ragged_config.py): the
# model file's engine takes ragged inputs 1-dimensional and the batch inputs as inputs; ONNX
# Runtime and TorchScript models; a Python model's requests arrive whole, the batch inputs
# with the first
for _kind in ("onnx", "torchscript", "python"):
    HONOURED_BY_KIND[_kind].setdefault("ModelConfig", set()).add("batch_input")
    HONOURED_BY_KIND[_kind].setdefault("ModelInput", set()).add("allow_ragged_batch")
    HONOURED_BY_KIND[_kind]["BatchInput"] = {"kind", "target_name", "data_type", "source_input"}
RAGGED_KINDS = "ragged batching is implemented for ONNX Runtime, TorchScript and Python models only"
# Why a field is refused, by its path without indices (the first prefix found); the rest:
# "wattserve does not implement it".
WHY = {
    "sequence_batching": "stateful models (the sequence batcher) are served for ONNX Runtime, TorchScript "
    "and Python models only",
    "sequence_batching.oldest.preserve_ordering": "the oldest strategy's preserve_ordering is not "
    "implemented",
    "sequence_batching.iterative_sequence": "iterative sequences are not implemented",
    "sequence_batching.state": "implicit state is implemented for ONNX Runtime and TorchScript models only",
    "sequence_batching.state.use_same_buffer_for_input_output": "state buffers shared by input and output "
    "are not implemented",
    "sequence_batching.state.use_growable_memory": "growable state memory is not implemented",
    "response_cache": "the response cache is not used for iteration-level (language) models",
    "optimization": "Triton's backend optimization settings are not applied",
    "model_repository_agents": "repository agents are not implemented",
    "batch_input": RAGGED_KINDS,
    "batch_output": "ragged outputs (batch_output) are not implemented",
    "input.allow_ragged_batch": RAGGED_KINDS,
    "input.optional": "optional inputs are implemented for ONNX Runtime and Python models only",
    "instance_group.kind": "KIND_MODEL is not implemented",
    "ensemble_scheduling.max_inflight_requests": "each step's model bounds its own queue",
    "model_transaction_policy": "decoupled responses are implemented for Python models only",
    "model_metrics": "custom metric histograms are not implemented",
    "runtime": "no backend library is loaded: wattserve's own engines serve the platform",
    "cc_model_filenames": "model files per compute capability are not implemented",
    "metric_tags": "metric tags are not implemented",
    "model_operations": "custom operation libraries are not loaded",
    "input.is_shape_tensor": "shape tensors are not implemented",
    "output.is_shape_tensor": "shape tensors are not implemented",
}
ALLOW_HINT = "--allow-unsupported-config loads the model without these fields"


class ConfigError(ValueError):
    """A model's configuration cannot be used; the message names the file (and line)."""


def parse_config(text: str, source: str = CONFIG_FILE) -> pb.ModelConfig:
    """``text`` (pbtxt) -> ModelConfig; errors say ``source:line:column: <what>``."""
    config = pb.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        # protobuf's message starts with "line:column : "; keep only its words
        words = str(exc).split(" : ", 1)[-1]
        where = f"{source}:{line}:{column}" if line is not None else source
        raise ConfigError(f"{where}: {words}") from None
    return config


def read_config(model_dir: Path) -> pb.ModelConfig:
    path = model_dir / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: missing (every model directory needs a {CONFIG_FILE})")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc})") from None
    config = parse_config(text, str(path))
    if config.name and config.name != model_dir.name:
        raise ConfigError(
            f"{path}: field 'name' is {config.name!r} but the directory is {model_dir.name!r} "
            "(Triton requires them to match)"
        )
    return config


def honoured(message_type: str, kind: str = "") -> set[str]:
    """The fields of ``message_type`` (a descriptor's name) that a ``kind`` of model honours."""
    return HONOURED.get(message_type, set()) | HONOURED_BY_KIND.get(kind, {}).get(message_type, set())


def unhonoured_fields(message: Message, prefix: str = "", kind: str = "", clear: bool = False) -> list[str]:
    """Paths of the fields set in ``message`` that wattserve does not implement for a ``kind``
    of model (``instance_group[0].kind`` for KIND_MODEL); ``clear``: clear them too."""
    own = honoured(message.DESCRIPTOR.name, kind)
    found: list[str] = []
    for field, value in message.ListFields():
        path = f"{prefix}{field.name}"
        if field.name not in own:
            found.append(path)
            if clear:
                message.ClearField(field.name)
            continue
        if (
            isinstance(message, pb.ModelInstanceGroup)
            and field.name == "kind"
            and value == message.KIND_MODEL
        ):
            found.append(path)
            if clear:
                message.ClearField("kind")  # KIND_AUTO: the server's device
            continue
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            continue  # parameters: keys are checked by the model plan
        if field.is_repeated:
            for i, item in enumerate(value):
                found.extend(unhonoured_fields(item, f"{path}[{i}].", kind, clear))
        else:
            found.extend(unhonoured_fields(value, f"{path}.", kind, clear))
    return found


def why(path: str) -> str:
    """The reason a field at ``path`` is refused."""
    bare = re.sub(r"\[\d+\]", "", path)
    parts = bare.split(".")
    for n in range(len(parts), 0, -1):
        reason = WHY.get(".".join(parts[:n]))
        if reason:
            return reason
    return "wattserve does not implement it"


def check_supported(config: pb.ModelConfig, kind: str, source: str, allow: bool) -> list[str]:
    """Refuse (ConfigError) a config that sets a field wattserve does not run, naming each
    field and why; with ``allow`` (``--allow-unsupported-config``) clear those fields from
    ``config`` instead and return a warning per field."""
    paths = unhonoured_fields(config, kind=kind, clear=allow)
    if not paths:
        return []
    if not allow:
        named = "; ".join(f"'{p}' is not supported by wattserve ({why(p)})" for p in paths)
        raise ConfigError(f"{source}: {named} ({ALLOW_HINT})")
    return [f"{source}: field '{p}' is not supported by wattserve ({why(p)}); ignored "
            "(--allow-unsupported-config)" for p in paths]  # fmt: skip


def select_versions(config: pb.ModelConfig, available: list[int]) -> list[int]:
    """Triton's version policy over the numeric version folders present (latest 1 by default)."""
    available = sorted(available)
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return available
    if choice == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in available if v in wanted]
    count = policy.latest.num_versions if choice == "latest" else 1
    return available[-max(1, count) :]


def to_text(config: pb.ModelConfig) -> str:
    """The config as Triton's pbtxt text (what ``wattserve export`` writes)."""
    return text_format.MessageToString(config)
