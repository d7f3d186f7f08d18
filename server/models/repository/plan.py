"""A Triton model repository -> one ``ModelPlan`` per served model version.

``<root>/<model>/config.pbtxt`` + ``<root>/<model>/<version>/<file>``. Config fields keep
Triton's meaning (see ``HONOURED`` in ``config.py``; anything else set fails the load
naming it, unless ``--allow-unsupported-config``: then a warning names it). wattserve's own
choices go in ``parameters`` (Triton's place for backend keys):

- ``batcher``: one of the policies in ``batchers/registry.py`` (static, dynamic, continuous,
  iteration, adaptive, aimd, single). Unset: ``WATTSERVE_BATCHER`` when it is set, else
  dynamic when the config has ``dynamic_batching`` and single (Triton's default scheduler:
  each request its own execution) when it has not.
- ``builtin``: with ``backend: "wattserve"``, which built-in model (a name in
  ``wattserve.engines.registry.MODELS``); defaults to the directory name.
- ``check_values``: "true" rejects NaN/Inf in float inputs with a 400.
- any key of ``MODEL_PARAMETERS`` (the settings marked per-model in server/settings.py) sets
  that WATTSERVE_* setting for this model only.

The result is the model's ``ServingConfig`` (server/models/serving_config.py), built here once; the
config.pbtxt fields and parameters are validated as settings on the way (one set of rules).

Auto-complete (Triton's, unless ``--disable-auto-complete-config``): a config without
``platform``/``backend`` gets it from the model file's name; a directory with no
config.pbtxt but a ``model.onnx`` gets its whole config from the file (inputs and outputs,
and ``max_batch_size`` 4 with dynamic batching when every tensor's first dim is dynamic,
Triton's default-max-batch-size; the same for any ONNX config that sets neither
max_batch_size nor tensors).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from wattserve.batchers.rate_limiter import InstanceLimits
from wattserve.engines.base import DATATYPE_TO_NUMPY, VARIABLE, Engine, EngineUnavailable, TensorSpec
from wattserve.engines.config import EngineConfig
from wattserve.engines.registry import MODELS, build_engine, build_lm_engine
from wattserve.server.models.plan import EngineFactory, ModelPlan
from wattserve.server.models.repository import model_config_pb2 as pb
from wattserve.server.models.repository import python_models
from wattserve.server.models.repository.config import (
    CONFIG_FILE,
    ConfigError,
    check_supported,
    read_config,
    select_versions,
)
from wattserve.server.models.repository.override import LoadOverride
from wattserve.server.models.repository.ragged_config import ragged_factory, ragged_spec
from wattserve.server.models.repository.rate_limit_config import group_limits
from wattserve.server.models.repository.sequence_config import SequenceModelSpec, sequence_spec
from wattserve.server.models.repository.sequence_plan import sequence_factory, sequence_serving, with_hidden
from wattserve.server.models.repository.warmup import warmed, warmup_samples
from wattserve.server.models.response_cache import decoupled_cache_refusal
from wattserve.server.models.serving_config import QueuePolicy, ServingConfig
from wattserve.server.settings import MODEL_PARAMETERS, Settings

log = logging.getLogger("wattserve.repository")

# platform (or backend) -> (kind, default file name)
PLATFORMS = {
    "onnxruntime_onnx": ("onnx", "model.onnx"),
    "onnxruntime": ("onnx", "model.onnx"),
    "pytorch_libtorch": ("torchscript", "model.pt"),
    "pytorch": ("torchscript", "model.pt"),
    "tensorrt_plan": ("tensorrt", "model.plan"),
    "tensorrt": ("tensorrt", "model.plan"),
    "wattserve": ("builtin", ""),
    "python": ("python", "model.py"),  # Triton's Python backend (server/models/repository/python_models.py)
    "ensemble": ("ensemble", ""),  # no engine: server/models/ensemble.py runs its steps
    "transformers": ("transformers", ""),  # a Hugging Face causal-LM folder as the version folder
}
BUILTIN_KEY = "builtin"
# Triton's auto-complete: the model file's default name -> its platform
FILE_PLATFORMS = {
    "model.onnx": "onnxruntime_onnx",
    "model.pt": "pytorch_libtorch",
    "model.plan": "tensorrt_plan",
}
# files Triton would auto-complete to a backend wattserve does not have: refused by name
REFUSED_FILES = {
    "model.savedmodel": "tensorflow_savedmodel (TensorFlow SavedModel)",
    "model.graphdef": "tensorflow_graphdef (TensorFlow GraphDef)",
}
DEFAULT_MAX_BATCH_SIZE = 4  # Triton's --backend-config=default-max-batch-size


class RepositorySource:
    """Models of one repository directory; re-read on every (re)load, like Triton's."""

    def __init__(self, root: Path, base: Settings) -> None:
        self.root = Path(root)
        self.base = base
        if not self.root.is_dir():
            raise ConfigError(f"model repository {self.root} is not a directory")

    def names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def plans(self, name: str) -> list[ModelPlan]:
        model_dir = self.root / name
        if not model_dir.is_dir():
            raise KeyError(name)
        return plan_model(model_dir, self.base)

    def plans_override(self, name: str, override: LoadOverride) -> list[ModelPlan]:
        """A load with a ``config`` (and maybe ``file:``) override: planned exactly as from a
        config.pbtxt, over the override's files or else the repository's model directory."""
        model_dir = override.model_dir or self.root / name
        if not model_dir.is_dir():
            raise KeyError(name)
        config = pb.ModelConfig()
        config.CopyFrom(override.config)
        return plan_config(model_dir, self.base, config, f"load of '{name}' (override config)")

    def fingerprint(self, name: str) -> tuple[tuple[str, int, int], ...]:
        """What the poller compares: every file under the model directory with its
        modification time and size (config.pbtxt, version folders, label files)."""
        model_dir = self.root / name
        found = []
        for path in sorted(model_dir.rglob("*")):
            try:
                stat = path.stat()
            except OSError:  # removed while we looked: the next poll sees the change
                continue
            found.append((str(path.relative_to(model_dir)), stat.st_mtime_ns, stat.st_size))
        return tuple(found)


def plan_model(model_dir: Path, base: Settings) -> list[ModelPlan]:
    """Every version of the model in ``model_dir`` that its version policy selects."""
    missing = not (model_dir / CONFIG_FILE).is_file()
    if missing and not base.disable_auto_complete_config and _has_file(model_dir, "model.onnx"):
        config = pb.ModelConfig()  # the whole config comes from model.onnx
    else:
        config = read_config(model_dir)
    return plan_config(model_dir, base, config, str(model_dir / CONFIG_FILE))


def plan_config(model_dir: Path, base: Settings, config: pb.ModelConfig, source: str) -> list[ModelPlan]:
    """``plan_model`` with ``config`` (read from ``source``, or a load's override) for the
    model files in ``model_dir``."""
    name = model_dir.name
    if not base.disable_auto_complete_config:
        auto_complete(config, model_dir, source)
    if config.response_cache.enable:  # Triton's checks and words, before any backend is looked at
        if config.model_transaction_policy.decoupled:
            raise ConfigError(decoupled_cache_refusal(name, source))
        if config.HasField("sequence_batching"):
            raise ConfigError(f"{source}: Response Cache does not currently support model '{name}' with "
                              "sequence batching scheduler. Please disable the response cache.")  # fmt: skip
    platform = config.platform or config.backend
    if not platform:
        raise ConfigError(f"{source}: neither 'platform' nor 'backend' is set, and auto-complete is "
                          "disabled (--disable-auto-complete-config)")  # fmt: skip
    if platform not in PLATFORMS:
        field = "platform" if config.platform else "backend"
        raise ConfigError(f"{source}: field '{field}' is {platform!r}; wattserve serves "
                          f"{', '.join(sorted(PLATFORMS))}")  # fmt: skip
    kind, default_file = PLATFORMS[platform]
    if kind == "ensemble":
        from wattserve.server.models.ensemble_graph import ensemble_plans

        return ensemble_plans(config, model_dir, base, source)
    allow = base.allow_unsupported_config
    warnings = check_supported(config, kind, source, allow)
    if kind == "python":  # auto_complete_config, and what a Python model may not ask for
        python_models.prepare(config, model_dir, base, source, warnings)
        warnings += check_supported(config, kind, f"{source} (as auto_complete_config left it)", allow)
    sequence = (
        sequence_spec(config, name, source, model_dir) if config.HasField("sequence_batching") else None
    )
    settings = _model_settings(config, base, kind, name, source, warnings)
    batching = config.max_batch_size > 0
    limits: list[InstanceLimits | None] = []
    devices = _instance_devices(config, base, source, warnings, kind, limits)
    steps = (kind == "builtin" and MODELS[settings.model].steps) or kind == "transformers"
    if kind == "transformers" and not batching:
        raise ConfigError(
            f"{source}: backend 'transformers' needs max_batch_size > 0 (the running sequences)"
        )
    serving = ServingConfig.from_settings(settings, devices, steps=steps)  # the one translation
    if config.dynamic_batching.preserve_ordering:
        serving = replace(serving, preserve_ordering=True)
    if any(limits):
        serving = replace(serving, rate_limits=tuple(limits))
    if config.response_cache.enable:  # (decoupled and stateful models refused above)
        serving = replace(serving, response_cache=True)
    if config.dynamic_batching.priority_queue_policy:
        serving = replace(serving, queue=_level_policies(config, serving.queue, source))
    if sequence is not None:
        serving = sequence_serving(serving, sequence)
    file_name = config.default_model_filename or default_file

    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if kind == "builtin" and not versions:
        versions = [1]  # a built-in needs no files
    chosen = select_versions(config, versions)
    if not chosen:
        raise ConfigError(f"{model_dir}: no version folder matches the version policy "
                          f"(found {versions or 'none'})")  # fmt: skip
    samples = warmup_samples(config, model_dir, source)  # Triton's model_warmup: run before READY
    plans = []
    for version in chosen:
        path = model_dir / str(version) / file_name
        if kind == "transformers":
            if not (path / "config.json").is_file():
                raise ConfigError(f"{path}: not a Hugging Face model folder (backend 'transformers' "
                                  "needs config.json, *.safetensors and tokenizer files there)")  # fmt: skip
        elif kind != "builtin" and not path.is_file():
            raise ConfigError(f"{path}: missing ({platform} needs {file_name} in each version folder)")
        factory = warmed(_engine_factory(kind, path, name, config, batching, source, sequence), samples,
                         config.model_transaction_policy.decoupled)  # fmt: skip
        plans.append(ModelPlan(name, str(version), serving, factory, batching=batching,
                               platform=platform, warnings=warnings, config=config))  # fmt: skip
    for warning in warnings:
        log.warning("%s", warning)
    return plans


# ---------------------------------------------------------------------------- auto-complete


def _version_dirs(model_dir: Path) -> list[Path]:
    return sorted(
        (p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name)
    )


def _has_file(model_dir: Path, file_name: str) -> bool:
    return any((v / file_name).exists() for v in _version_dirs(model_dir))


def auto_complete(config: pb.ModelConfig, model_dir: Path, source: str) -> None:
    """Fill what Triton's auto-complete fills, in place: the platform from the model file's
    name; for an ONNX model whose config sets no max_batch_size and no tensors (a directory
    without config.pbtxt is one), max_batch_size 4 and dynamic batching when every tensor of
    model.onnx has a dynamic first dim, as Triton's onnxruntime backend does."""
    if not config.platform and not config.backend:
        names = [config.default_model_filename] if config.default_model_filename else []
        names += [*FILE_PLATFORMS, *REFUSED_FILES]
        for file_name in names:
            if not _has_file(model_dir, file_name):
                continue
            if file_name in REFUSED_FILES:
                raise ConfigError(f"{source}: {file_name} is {REFUSED_FILES[file_name]}; wattserve has no "
                                  "TensorFlow backend")  # fmt: skip
            suffix_platform = {Path(f).suffix: p for f, p in FILE_PLATFORMS.items()}
            platform = FILE_PLATFORMS.get(file_name) or suffix_platform.get(Path(file_name).suffix)
            if platform:
                config.platform = platform
                break
        else:
            raise ConfigError(f"{source}: neither 'platform' nor 'backend' is set and no model file "
                              f"completes it ({', '.join(FILE_PLATFORMS)} in a version folder)")  # fmt: skip
    onnx = PLATFORMS.get(config.platform or config.backend, ("",))[0] == "onnx"
    if onnx and config.max_batch_size == 0 and not config.input and not config.output:
        newest = _version_dirs(model_dir)[-1] / (config.default_model_filename or "model.onnx")
        if _onnx_batches(newest, source):
            config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
            if not config.HasField("sequence_batching"):  # (one scheduler: a sequence model keeps its own)
                config.dynamic_batching.SetInParent()  # Triton enables it with default settings


def _onnx_batches(path: Path, source: str) -> bool:
    """True when every graph input and output has a dynamic first dim (Triton's test for a
    model that can batch). Reads the graph only, not external weights."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as exc:  # a corrupt file: say so here rather than at engine build
        raise ConfigError(f"{source}: cannot complete the config from {path}: {exc}") from None
    initializers = {i.name for i in graph.initializer}
    tensors = [t for t in graph.input if t.name not in initializers] + list(graph.output)

    def dynamic_first(t: Any) -> bool:
        dims = t.type.tensor_type.shape.dim
        return bool(dims) and (bool(dims[0].dim_param) or not dims[0].HasField("dim_value"))

    return bool(tensors) and all(dynamic_first(t) for t in tensors)


# ---------------------------------------------------------------------------- settings


def _model_settings(
    config: pb.ModelConfig, base: Settings, kind: str, name: str, source: str, warnings: list[str]
) -> Settings:
    """The process settings with this model's config.pbtxt applied, validated by the same
    rules as the environment; read once, into its ServingConfig, and not kept."""
    update: dict[str, Any] = {}
    params = {k: v.string_value for k, v in config.parameters.items()}
    for key, value in params.items():
        if key in MODEL_PARAMETERS:
            update[key] = value
        elif key != BUILTIN_KEY and kind != "python":  # a Python model reads its own keys
            warnings.append(f"{source}: parameters key {key!r} is not a wattserve model setting; ignored")
    if kind == "builtin":
        builtin = params.get(BUILTIN_KEY, name)
        if builtin not in MODELS:
            raise ConfigError(
                f"{source}: parameters key 'builtin' is {builtin!r}; built-ins: {', '.join(MODELS)}"
            )
        update["model"] = builtin
    else:
        update["model"] = name
    if config.HasField("sequence_batching"):  # a stateful model runs on the sequence batcher only
        if update.get("batcher", "sequence") not in ("sequence", "sequence_oldest"):
            raise ConfigError(f"{source}: parameters key 'batcher' is {update['batcher']!r} but a model with "
                              "'sequence_batching' runs on the sequence batcher")  # fmt: skip
        update["batcher"] = "sequence"  # its strategy's (sequence_plan.sequence_serving)
    elif "batcher" not in update and "batcher" in base.model_fields_set:
        update["batcher"] = base.batcher
    elif "batcher" not in update:  # Triton batches across requests only when the config asks
        update["batcher"] = "dynamic" if config.HasField("dynamic_batching") else "single"
    if "max_queue_wait_s" not in update and "max_queue_wait_s" not in base.model_fields_set:
        # a bound the user did not ask for must not undercut the config's own delays and
        # timeouts (L0_batcher's 10 s max_queue_delay): Triton has none, so none here
        update["max_queue_wait_s"] = 0.0
    update["max_batch_size"] = max(1, config.max_batch_size)
    if config.max_batch_size < 0:
        raise ConfigError(f"{source}: field 'max_batch_size' must be >= 0")
    if config.HasField("dynamic_batching"):
        if config.max_batch_size == 0:
            warnings.append(
                f"{source}: 'dynamic_batching' with max_batch_size 0 has nothing to batch; ignored"
            )
        else:
            update.update(_dynamic_batching(config.dynamic_batching, source, warnings))
    update["instances"] = max(1, sum(_group_count(g) * max(1, len(g.gpus)) for g in config.instance_group)
                              if config.instance_group else 1)  # fmt: skip
    try:
        return Settings(**{**base.model_dump(), **update})
    except ValueError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _dynamic_batching(db: pb.ModelDynamicBatching, source: str, warnings: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "preferred_batch_sizes": list(db.preferred_batch_size),
        "max_queue_delay_ms": db.max_queue_delay_microseconds / 1000.0,  # Triton's default: 0
        "priority_levels": max(1, db.priority_levels),
        "default_priority_level": db.default_priority_level,
    }
    if db.HasField("default_queue_policy"):
        policy = db.default_queue_policy
        out["timeout_action"] = "delay" if policy.timeout_action == pb.ModelQueuePolicy.DELAY else "reject"
        out["default_timeout_ms"] = policy.default_timeout_microseconds / 1000.0 or None
        out["allow_timeout_override"] = policy.allow_timeout_override
        if policy.max_queue_size > 0:  # Triton's 0 is unbounded; wattserve keeps its bound
            out["max_queue_size"] = policy.max_queue_size
    return out


def _level_policies(config: pb.ModelConfig, default: QueuePolicy, source: str) -> QueuePolicy:
    """Triton's ``priority_queue_policy``: each listed level's own queue policy (timeout,
    its action, override, and a bound on that level's queued requests)."""
    db = config.dynamic_batching
    levels = {}
    for level, policy in sorted(db.priority_queue_policy.items()):
        if not 1 <= level <= max(1, db.priority_levels):
            raise ConfigError(f"{source}: dynamic_batching.priority_queue_policy has level {level}; the "
                              f"levels are 1..{max(1, db.priority_levels)} (priority_levels)")  # fmt: skip
        levels[int(level)] = replace(
            default,
            default_timeout_ms=policy.default_timeout_microseconds / 1000.0 or None,
            allow_timeout_override=policy.allow_timeout_override,
            timeout_action="delay" if policy.timeout_action == pb.ModelQueuePolicy.DELAY else "reject",
            max_queue_size=policy.max_queue_size,
        )
    return replace(default, levels=levels)


def _group_count(group: pb.ModelInstanceGroup) -> int:
    return group.count if group.count > 0 else 1  # Triton: count defaults to 1


# kinds whose engines may run on a GPU: Triton's default placement (one instance per visible
# GPU). Built-ins keep the server's WATTSERVE_DEVICE and WATTSERVE_INSTANCES.
GPU_KINDS = {"onnx", "torchscript", "tensorrt", "transformers"}


def visible_gpus() -> int:
    """CUDA devices this process sees (0 on a CPU-only host): where Triton places instances
    that name no GPU."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _runs_on_gpu(kind: str) -> bool:
    """Whether this kind's engine can use a GPU here (Triton places only such models on
    GPUs): an ONNX Runtime build without its CUDA provider runs on the CPU."""
    if kind not in GPU_KINDS:
        return False
    if kind == "onnx":
        import onnxruntime

        return "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    return True


def _instance_devices(
    config: pb.ModelConfig,
    base: Settings,
    source: str,
    warnings: list[str],
    kind: str = "",
    limits: list[InstanceLimits | None] | None = None,
) -> list[str] | None:
    """One device per instance: ``count`` on each listed GPU (Triton), CPU, or auto. As in
    Triton, no ``instance_group`` is one instance per visible GPU (one on the server's device
    on a CPU-only host, or when the user chose a device), and KIND_GPU without ``gpus`` is
    ``count`` on every visible GPU. ``limits``: filled with each instance's group's rate limiter."""
    if not config.instance_group:
        gpus_seen = visible_gpus() if base.device == "auto" and _runs_on_gpu(kind) else 0
        return [f"cuda:{g}" for g in range(gpus_seen)] or None
    devices: list[str] = []
    kinds = pb.ModelInstanceGroup
    for i, group in enumerate(config.instance_group):
        count = _group_count(group)
        if group.kind == kinds.KIND_GPU:
            gpus = [*group.gpus] or list(range(visible_gpus()))
            if not gpus:  # Triton refuses it too: there is no GPU to place it on
                raise ConfigError(f"{source}: instance_group[{i}] has kind KIND_GPU but no GPUs are "
                                  "available (no CUDA device is visible)")  # fmt: skip
            devices += [f"cuda:{g}" for g in gpus for _ in range(count)]
        elif group.kind == kinds.KIND_CPU:
            devices += ["cpu"] * count
        else:  # KIND_AUTO (KIND_MODEL was refused, or cleared by --allow-unsupported-config)
            devices += [base.device] * count
        if limits is not None:
            limits += [group_limits(group)] * (len(devices) - len(limits))
    return devices


# ---------------------------------------------------------------------------- engines


# Triton's config names a datatype TYPE_<name>; the protocol calls TYPE_STRING "BYTES".
CONFIG_DATATYPES = {"STRING": "BYTES"}


def config_datatype(datatype: str) -> str:
    """A protocol datatype as a config's ``data_type`` names it (BYTES -> TYPE_STRING)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def config_tensors(tensors: Any, source: str, what: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """(client-side specs, model-side specs): they differ only where ``reshape`` is set."""
    outer, inner = [], []
    for i, t in enumerate(tensors):
        name = pb.DataType.Name(t.data_type).removeprefix("TYPE_")
        datatype = CONFIG_DATATYPES.get(name, name)
        if datatype not in DATATYPE_TO_NUMPY:
            raise ConfigError(f"{source}: {what}[{i}] ({t.name}) data_type TYPE_{name} is not "
                              "supported by wattserve")  # fmt: skip
        dims = tuple(int(d) for d in t.dims)
        if isinstance(t, pb.ModelInput) and t.format != pb.ModelInput.FORMAT_NONE and len(dims) != 3:
            layout = pb.ModelInput.Format.Name(t.format)
            raise ConfigError(f"{source}: {what}[{i}] ({t.name}) format {layout}: model input NHWC/NCHW "
                              "require 3 dims")  # fmt: skip
        if any(d < VARIABLE for d in dims):
            raise ConfigError(f"{source}: {what}[{i}] ({t.name}) dims {list(dims)}: a dimension is a "
                              "size >= 0 or -1 (variable)")  # fmt: skip
        shape = tuple(int(d) for d in t.reshape.shape) if t.HasField("reshape") else dims
        optional = isinstance(t, pb.ModelInput) and t.optional  # Triton's: a request may leave it out
        outer.append(TensorSpec(t.name, dims, datatype, optional=optional))
        inner.append(TensorSpec(t.name, shape, datatype, optional=optional))
    return outer, inner


def _engine_factory(
    kind: str, path: Path, name: str, config: pb.ModelConfig, batching: bool, source: str,
    sequence: SequenceModelSpec | None = None,
) -> EngineFactory:  # fmt: skip
    in_outer, in_inner = config_tensors(config.input, source, "input")
    out_outer, out_inner = config_tensors(config.output, source, "output")
    ragged = ragged_spec(config, source)
    if kind == "python":  # its requests carry the control tensors (runtime); no state
        return python_models.python_factory(path, name, config, in_outer, out_outer, ragged)
    if ragged is not None:  # Triton's ragged batching: the model file's engine, batched by RaggedEngine
        # a TorchScript file names no tensors: the batch inputs are inputs after the config's
        batch_specs = [TensorSpec(b.target, (VARIABLE,) * (b.kind == "BATCH_ITEM_SHAPE"), b.datatype)
                       for b in ragged.batch_inputs] if kind == "torchscript" else []  # fmt: skip
        model_file = ModelFile(path, name, batching, in_inner + batch_specs, out_inner)
        return ragged_factory(KIND_ENGINES[kind], model_file, in_outer, out_outer, ragged, source)
    if sequence is not None:
        return sequence_factory(_tensor_factory(kind, path, name, batching, source, *with_hidden(
            sequence, in_outer, in_inner, out_outer, out_inner)), sequence,
            {s.name for s in out_outer})  # fmt: skip
    return _tensor_factory(kind, path, name, batching, source, in_outer, in_inner, out_outer, out_inner)


def _tensor_factory(
    kind: str, path: Path, name: str, batching: bool, source: str, in_outer: list[TensorSpec],
    in_inner: list[TensorSpec], out_outer: list[TensorSpec], out_inner: list[TensorSpec],
) -> EngineFactory:  # fmt: skip
    """The engine of a model file whose config declares these tensors (client side, model side)."""
    if kind == "torchscript" and (not in_inner or not out_inner):
        raise ConfigError(f"{source}: pytorch_libtorch models need 'input' and 'output' in the config "
                          "(TorchScript files carry no tensor names or shapes)")  # fmt: skip
    if kind == "tensorrt" and not batching:
        raise ConfigError(f"{source}: tensorrt_plan with max_batch_size 0 is not supported")

    serve = KIND_ENGINES[kind]

    def build(engine_config: EngineConfig) -> Engine:
        engine = serve(ModelFile(path, name, batching, in_inner, out_inner), engine_config)
        scalars = _check_against_config(engine, in_inner, out_inner, source)
        if scalars or in_outer != in_inner or out_outer != out_inner:
            from wattserve.engines.reshape import ReshapedEngine

            engine = ReshapedEngine(engine, in_outer or engine.inputs, out_outer or engine.outputs)
        return engine

    return build


@dataclass(frozen=True)
class ModelFile:
    """What a repository entry says about its model file: where, its name, batch axis, tensors."""

    path: Path
    name: str
    batching: bool  # False: Triton's max_batch_size 0
    inputs: list[TensorSpec]  # model-side specs from the config (empty: read from the file)
    outputs: list[TensorSpec]


def _onnx_file(model: ModelFile, config: EngineConfig) -> Engine:
    from wattserve.engines.onnxruntime_engine import OnnxRuntimeEngine

    max_batch = config.max_batch_size if model.batching else 1
    return OnnxRuntimeEngine(model.path, name=model.name, max_batch_size=max_batch, device=config.device,
                             threads=config.torch_threads, batched=model.batching,
                             optional=[s.name for s in model.inputs if s.optional],
                             flush_denormal=config.flush_denormal)  # fmt: skip


def _torchscript_file(model: ModelFile, config: EngineConfig) -> Engine:
    from wattserve.engines.torchscript_engine import TorchScriptEngine

    max_batch = config.max_batch_size if model.batching else 1
    return TorchScriptEngine(model.path, name=model.name, inputs=model.inputs, outputs=model.outputs,
                             max_batch_size=max_batch, device=config.device,
                             batched=model.batching, threads=config.torch_threads)  # fmt: skip


def _tensorrt_plan(model: ModelFile, config: EngineConfig) -> Engine:
    from wattserve.engines.tensorrt_engine import TensorRTEngine, cuda_device_index

    return TensorRTEngine(
        model.path.read_bytes(), name=model.name, device_index=cuda_device_index(config.device)
    )


def _builtin(model: ModelFile, config: EngineConfig) -> Engine:
    return build_engine(config)  # config.model is the built-in's name (_model_settings)


def _transformers_folder(model: ModelFile, config: EngineConfig) -> Engine:
    return build_lm_engine(config, model.path, model.name)


# PLATFORMS' kind -> the engine that serves that kind of model
KIND_ENGINES: dict[str, Callable[[ModelFile, EngineConfig], Engine]] = {
    "transformers": _transformers_folder,
    "onnx": _onnx_file,
    "torchscript": _torchscript_file,
    "tensorrt": _tensorrt_plan,
    "builtin": _builtin,
}


def _scalar_as_ones(model: tuple[int, ...], config: tuple[int, ...]) -> bool:
    """Triton's rule for a scalar tensor (shape [] in the model): a config may declare it
    with dims of ones ([1], [1, 1]); clients send that shape, the model gets the scalar."""
    return model == () and len(config) > 0 and all(d == 1 for d in config)


def _dims_agree(model: tuple[int, ...], config: tuple[int, ...]) -> bool:
    """Same rank, and each dimension equal or variable (-1) on either side: a config may
    fix what the model leaves variable, or leave variable what the model fixes."""
    return len(model) == len(config) and all(
        VARIABLE in (m, c) or m == c for m, c in zip(model, config, strict=True)
    )


def _check_against_config(
    engine: Engine, inputs: list[TensorSpec], outputs: list[TensorSpec], source: str
) -> bool:
    """A config that declares tensors must agree with what the model file says. Returns
    whether some tensor is a model scalar the config declares as ones (to be reshaped)."""
    scalars = False
    for what, declared, actual in (("input", inputs, engine.inputs), ("output", outputs, engine.outputs)):
        if not declared:
            continue
        have = {s.name: s for s in actual}
        if set(have) != {s.name for s in declared}:
            raise EngineUnavailable(f"{source}: {what} names {sorted(s.name for s in declared)} but the "
                                    f"model has {sorted(have)}")  # fmt: skip
        for spec in declared:
            real = have[spec.name]
            if real.datatype == spec.datatype and _scalar_as_ones(tuple(real.shape), tuple(spec.shape)):
                scalars = True
                continue
            if real.datatype != spec.datatype or not _dims_agree(real.shape, spec.shape):
                raise EngineUnavailable(
                    f"{source}: {what} {spec.name!r} is TYPE_{spec.datatype} {list(spec.shape)} in the "
                    f"config but TYPE_{real.datatype} {list(real.shape)} in the model"
                )
    return scalars
