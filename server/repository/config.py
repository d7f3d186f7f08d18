"""Read one model's ``config.pbtxt`` as Triton reads it, and list what wattserve ignores.

The text is parsed by protobuf's own text format against Triton's ``ModelConfig`` message
(vendored generated module), never by hand: an unknown field or a syntax error is a
``ConfigError`` that names the file, the line and protobuf's own words for the field.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from google.protobuf.message import Message
from wattserve.server.repository import model_config_pb2 as pb

CONFIG_FILE = "config.pbtxt"

# Every config.pbtxt field wattserve honours, with Triton's meaning. A field set in a
# config and absent here is reported by ``unhonoured_fields`` (a startup warning).
HONOURED: dict[str, set[str]] = {
    "ModelConfig": {
        "name", "platform", "backend", "version_policy", "max_batch_size", "input", "output",
        "dynamic_batching", "instance_group", "parameters", "default_model_filename",
    },
    "ModelInput": {"name", "data_type", "dims", "reshape"},
    "ModelOutput": {"name", "data_type", "dims", "reshape", "label_filename"},  # labels: classification
    "ModelTensorReshape": {"shape"},
    "ModelDynamicBatching": {
        "preferred_batch_size", "max_queue_delay_microseconds", "priority_levels",
        "default_priority_level", "default_queue_policy",
    },
    "ModelQueuePolicy": {
        "timeout_action", "default_timeout_microseconds", "allow_timeout_override", "max_queue_size",
    },
    "ModelInstanceGroup": {"name", "count", "kind", "gpus"},
    "ModelVersionPolicy": {"latest", "all", "specific"},
    "Latest": {"num_versions"},
    "All": set(),
    "Specific": {"versions"},
    "ParametersEntry": {"key", "value"},
    "ModelParameter": {"string_value"},
}  # fmt: skip


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


def unhonoured_fields(message: Message, prefix: str = "") -> list[str]:
    """Paths of the fields set in ``message`` that wattserve does not implement."""
    kind = message.DESCRIPTOR.name
    honoured = HONOURED.get(kind, set())
    found: list[str] = []
    for field, value in message.ListFields():
        path = f"{prefix}{field.name}"
        if field.name not in honoured:
            found.append(path)
            continue
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            continue  # parameters: keys are checked by the model plan
        if field.is_repeated:
            for i, item in enumerate(value):
                found.extend(unhonoured_fields(item, f"{path}[{i}]."))
        else:
            found.extend(unhonoured_fields(value, f"{path}."))
    return found


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
