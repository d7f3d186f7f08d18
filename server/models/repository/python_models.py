"""Repository entries with ``backend: "python"``: Triton's Python models (``model.py``).

The planner calls ``prepare`` once per load (Triton's ``auto_complete_config``, refusals and
warnings that name what is not supported) and ``python_factory`` for the engine factory.
The model sees its config as Triton's JSON: protobuf field names, every field present,
64-bit integers as numbers (Triton's ``model_config`` argument).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from wattserve.engines.base import Engine, TensorSpec
from wattserve.engines.config import EngineConfig
from wattserve.engines.ragged import RaggedSpec
from wattserve.server.models.plan import EngineFactory
from wattserve.server.models.repository import model_config_pb2 as pb
from wattserve.server.models.repository.config import ConfigError
from wattserve.server.settings import Settings

KIND = "python"
DEFAULT_FILE = "model.py"
# Python backend parameters wattserve cannot honour: refused at load, by name
REFUSED_PARAMETERS = {
    "EXECUTION_ENV_PATH": "a custom Python execution environment (conda-pack tarball); wattserve runs "
    "Python models in its own interpreter: install the model's packages into the server's environment",
}
# ... and those it notes and ignores
IGNORED_PARAMETERS = {
    "FORCE_CPU_ONLY_INPUT_TENSORS": "inputs are always CPU tensors (numpy) in wattserve",
    "shm-default-byte-size": "a Triton backend setting; wattserve sizes a shared-memory segment per message",
    "shm-growth-byte-size": "a Triton backend setting; wattserve sizes a shared-memory segment per message",
}
_INT64 = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)


def config_dict(config: pb.ModelConfig) -> dict[str, Any]:
    """The config as Triton gives it to a Python model (``json.loads(args["model_config"])``)."""
    data = json_format.MessageToDict(config, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)  # fmt: skip
    _int64_as_numbers(config, data)
    return data


def _int64_as_numbers(message: Message, data: dict[str, Any]) -> None:
    """protobuf's JSON writes 64-bit integers as strings; Triton's model_config has numbers."""
    for field in message.DESCRIPTOR.fields:
        name = field.name
        if name not in data:
            continue
        value = data[name]
        if field.cpp_type in _INT64:
            data[name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            children = getattr(message, name)
            if isinstance(value, list):
                for child, item in zip(children, value, strict=False):
                    _int64_as_numbers(child, item)
            elif isinstance(value, dict):
                _int64_as_numbers(children, value)


def prepare(
    config: pb.ModelConfig, model_dir: Path, base: Settings, source: str, warnings: list[str]
) -> None:
    """In place, before the config is planned: refuse what wattserve cannot run, note what it
    ignores, and let ``TritonPythonModel.auto_complete_config`` complete the config (unless
    auto-complete is disabled, as in Triton)."""
    for key in config.parameters:
        if key in REFUSED_PARAMETERS:
            raise ConfigError(f"{source}: parameters key {key!r} is not supported: {REFUSED_PARAMETERS[key]}")
        if key in IGNORED_PARAMETERS:
            warnings.append(f"{source}: parameters key {key!r} ignored: {IGNORED_PARAMETERS[key]}")
    for i, group in enumerate(config.instance_group):
        if group.kind == pb.ModelInstanceGroup.KIND_GPU:
            warnings.append(f"{source}: instance_group[{i}] KIND_GPU: a Python model's instances get "
                            "model_instance_kind GPU, but wattserve gives them CPU tensors only")  # fmt: skip
    if base.disable_auto_complete_config:
        return
    path = _newest_model_file(config, model_dir)
    if path is None:
        return  # the planner names the missing file
    if _isolation(config, base) == "process":  # as Triton: imported in a stub, not the server
        from wattserve.engines.python_backend.autocomplete_process import (
            AutoCompleteFailed,
            complete_in_process,
        )

        try:
            data = complete_in_process(path, config_dict(config), base.python_stub_timeout_s)
        except AutoCompleteFailed as exc:
            raise ConfigError(f"{path}: {exc}") from None
    else:
        data = _complete_here(config, path)
    if data is None:
        return
    try:
        config.Clear()
        json_format.ParseDict(data, config)
    except json_format.ParseError as exc:
        raise ConfigError(f"{path}: auto_complete_config made an invalid config: {exc}") from None


def _isolation(config: pb.ModelConfig, base: Settings) -> str:
    """The model's ``python_model_isolation``: its parameters', else the server's."""
    if "python_model_isolation" in config.parameters:
        return config.parameters["python_model_isolation"].string_value
    return base.python_model_isolation


def _complete_here(config: pb.ModelConfig, path: Path) -> dict[str, Any] | None:
    """``auto_complete_config`` in the server's process (thread isolation)."""
    from wattserve.engines.python_backend.autocomplete import ModelConfig
    from wattserve.engines.python_backend.engine import MODEL_CLASS, load_model_module

    try:
        model_class = getattr(load_model_module(path), MODEL_CLASS)
    except Exception as exc:
        raise ConfigError(f"{path}: cannot import the model: {type(exc).__name__}: {exc}") from None
    complete = getattr(model_class, "auto_complete_config", None)
    if complete is None:
        return None
    try:
        completed = complete(ModelConfig(config_dict(config)))
        data: dict[str, Any] | None = completed.as_dict() if completed is not None else None
    except Exception as exc:
        raise ConfigError(f"{path}: auto_complete_config raised {type(exc).__name__}: {exc}") from None
    if data is None:
        raise ConfigError(f"{path}: auto_complete_config returned None (it must return the config)")
    return data


def _newest_model_file(config: pb.ModelConfig, model_dir: Path) -> Path | None:
    name = config.default_model_filename or DEFAULT_FILE
    versions = sorted(
        (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )
    found = [v / name for v in versions if (v / name).is_file()]
    return found[-1] if found else None


def python_factory(
    path: Path,
    name: str,
    config: pb.ModelConfig,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    ragged: RaggedSpec | None = None,
) -> EngineFactory:
    """Build one instance per call (on its engine thread): its own ``TritonPythonModel``, in
    a worker process (``python_model_isolation`` process, the default) or on that thread.
    ``ragged``: Triton's ragged batching (its requests come whole, whatever their shapes; the
    batch inputs are inputs of the batch's first request, ``engines.ragged.with_batch_inputs``)."""
    from wattserve.engines.python_backend.engine import PythonModelEngine, PythonModelFile

    if not config.input or not config.output:
        raise ConfigError(f"{name}: a Python model's config needs 'input' and 'output' (set them, or "
                          "add them in auto_complete_config)")  # fmt: skip
    data = config_dict(config)
    batching = config.max_batch_size > 0
    model = PythonModelFile(
        path=path, name=name, version=path.parent.name, config=json.loads(json.dumps(data)), inputs=inputs,
        outputs=outputs, batching=batching, max_batch_size=max(1, config.max_batch_size),
        decoupled=config.model_transaction_policy.decoupled,
    )  # fmt: skip
    if ragged is not None:
        model = replace(model, inputs=[replace(s, ragged=s.name in ragged.ragged) for s in inputs],
                        batch_inputs=ragged.batch_inputs)  # fmt: skip
    instances = itertools.count()

    def build(engine_config: EngineConfig) -> Engine:
        if engine_config.python_model_isolation == "thread":
            return PythonModelEngine(model, device=engine_config.device, instance=next(instances))
        from wattserve.engines.python_backend.process_engine import ProcessModelEngine

        return ProcessModelEngine(model, device=engine_config.device, instance=next(instances),
                                  execute_timeout_s=engine_config.python_execute_timeout_s,
                                  stub_timeout_s=engine_config.python_stub_timeout_s)  # fmt: skip

    return build
