"""A config's ragged batching (``allow_ragged_batch``, ``batch_input``), checked at load.

Triton's rules, with the reason named: a batch input's source is one of the model's inputs, its
kind is one Triton defines, its target is a tensor of the model that no client sends, and its
data type is a number type; the model is batched (max_batch_size > 0), not a stateful one, and
reshapes no tensor.
The model file itself is checked when it is loaded (``ragged_factory``).
"""

from __future__ import annotations

from wattserve.engines.base import Engine, EngineUnavailable, TensorSpec
from wattserve.engines.config import EngineConfig
from wattserve.engines.ragged import KINDS, BatchInput, RaggedEngine, RaggedSpec
from wattserve.server.models.repository import model_config_pb2 as pb
from wattserve.server.models.repository.config import ConfigError

BATCH_INPUT_TYPES = {"INT32", "INT64", "FP32"}  # what an element count or a shape is given as


def ragged_spec(config: pb.ModelConfig, source: str) -> RaggedSpec | None:
    """The config's ragged inputs and batch inputs, or None when it has neither; a
    ``ConfigError`` naming the field for one that cannot be served."""
    ragged = frozenset(i.name for i in config.input if i.allow_ragged_batch)
    if not ragged and not config.batch_input:
        return None
    if config.max_batch_size == 0:
        raise ConfigError(f"{source}: ragged batching ('allow_ragged_batch', 'batch_input') needs "
                          "max_batch_size > 0 (a model that batches)")  # fmt: skip
    if config.HasField("sequence_batching"):
        raise ConfigError(f"{source}: ragged batching with sequence_batching is not supported by wattserve")
    reshaped = [t.name for t in config.input if t.HasField("reshape")]
    reshaped += [t.name for t in config.output if t.HasField("reshape")]
    if reshaped:
        raise ConfigError(f"{source}: 'reshape' of {reshaped} with ragged batching is not supported by "
                          "wattserve (a ragged input reaches the model 1-dimensional)")  # fmt: skip
    names = {i.name for i in config.input}
    inputs: list[BatchInput] = []
    for n, b in enumerate(config.batch_input):
        where = f"{source}: batch_input[{n}]"
        kind = pb.BatchInput.Kind.Name(b.kind)
        if kind not in KINDS:
            raise ConfigError(f"{where}: kind {kind} is not one Triton defines ({', '.join(KINDS)})")
        if len(b.target_name) != 1:
            raise ConfigError(f"{where}: target_name names {len(b.target_name)} tensors; one is needed")
        if len(b.source_input) != 1:
            raise ConfigError(f"{where} ({kind}): source_input names {len(b.source_input)} inputs; "
                              "one is needed")  # fmt: skip
        target, src = b.target_name[0], b.source_input[0]
        if src not in names:
            raise ConfigError(f"{where} ({kind}): source_input {src!r} is not an input of the model "
                              f"(inputs: {sorted(names)})")  # fmt: skip
        if target in names or any(target == i.target for i in inputs):
            raise ConfigError(f"{where} ({kind}): target_name {target!r} is already an input")
        datatype = pb.DataType.Name(b.data_type).removeprefix("TYPE_")
        if datatype not in BATCH_INPUT_TYPES:
            raise ConfigError(f"{where} ({kind}): data_type TYPE_{datatype}; a batch input is "
                              f"{', '.join('TYPE_' + t for t in sorted(BATCH_INPUT_TYPES))}")  # fmt: skip
        inputs.append(BatchInput(target, kind, datatype, src))
    return RaggedSpec(ragged, tuple(inputs))


def ragged_factory(serve: object, model_file: object, inputs: list[TensorSpec], outputs: list[TensorSpec],
                   spec: RaggedSpec, source: str):  # fmt: skip
    """The engine of a ragged model: the model file's engine (``serve(model_file, config)``),
    whose inputs must be the config's inputs and the batch inputs' targets, in a
    ``RaggedEngine``."""

    def build(engine_config: EngineConfig) -> Engine:
        inner: Engine = serve(model_file, engine_config)  # type: ignore[operator]
        have = {s.name for s in inner.inputs}
        want = {s.name for s in inputs} | {b.target for b in spec.batch_inputs}
        if have != want:
            inner.close()
            raise EngineUnavailable(f"{source}: the model's inputs are {sorted(have)} but the config's "
                                    f"inputs and batch_input targets are {sorted(want)}")  # fmt: skip
        types = {s.name: s.datatype for s in inner.inputs}
        for b in spec.batch_inputs:
            if types[b.target] != b.datatype:
                inner.close()
                raise EngineUnavailable(f"{source}: batch_input {b.target!r} ({b.kind}) is "
                                        f"TYPE_{b.datatype} in the config but TYPE_{types[b.target]} in "
                                        "the model")  # fmt: skip
        if outputs and {s.name for s in inner.outputs} != {s.name for s in outputs}:
            inner.close()
            raise EngineUnavailable(f"{source}: output names {sorted(s.name for s in outputs)} but the "
                                    f"model has {sorted(s.name for s in inner.outputs)}")  # fmt: skip
        return RaggedEngine(inner, inputs, outputs, spec)

    return build
