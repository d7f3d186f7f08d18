"""The documents both front ends serve: server metadata, model metadata, the model
configuration as served, and Triton's statistics. HTTP answers them as JSON, gRPC parses
them into its messages (their field names are the same)."""

from __future__ import annotations

from typing import Any

from wattserve.batchers.dynamic import DynamicBatcher, DynamicConfig
from wattserve.batchers.status import Status
from wattserve.server.core.admission import Refused, select
from wattserve.server.models.model_set import ModelSet, ModelState, UnknownModel
from wattserve.server.models.repository import model_config_pb2 as pb
from wattserve.server.models.repository.plan import config_datatype
from wattserve.server.models.repository.sequence_config import sequence_batching_doc
from wattserve.server.models.runtime import ModelRuntime

VERSION = "0.1.0"
EXTENSIONS = ["binary_tensor_data", "schedule_policy", "model_configuration", "classification",
              "model_repository", "statistics", "system_shared_memory", "trace", "logging",
              "generate"]  # fmt: skip


def server_doc() -> dict[str, Any]:
    return {"name": "wattserve", "version": VERSION, "extensions": EXTENSIONS}


def serving_runtime(models: ModelSet, name: str, version: str | None) -> ModelRuntime:
    """A loaded runtime (metadata needs its engine), ready or not; else Refused saying why."""
    try:
        entry = models.lookup(name, version)
    except UnknownModel as exc:
        raise Refused(str(exc), Status.NOT_FOUND) from None
    if entry.runtime is not None and entry.runtime.engine is not None:
        return entry.runtime
    return select(models, name, version)  # raises the refusal that says why


def metadata_doc(models: ModelSet, runtime: ModelRuntime) -> dict[str, Any]:
    """KServe v2 model metadata (HTTP's JSON, and the fields of gRPC's ModelMetadataResponse)."""
    engine = runtime.engine
    assert engine is not None
    batched = runtime.batching
    name = runtime.name
    versions = [e.version for e in models.entries() if e.name == name and e.state is ModelState.READY]
    return {
        "name": name,
        "versions": versions,
        "platform": runtime.platform or engine.platform,
        "inputs": [s.metadata(batched) for s in engine.inputs],
        "outputs": [s.metadata(batched) for s in engine.outputs],
    }


def stats_doc(runtime: ModelRuntime) -> dict[str, Any]:
    rejected = runtime.metrics.count("bad_request")
    return runtime.metrics.statistics.triton(runtime.name, runtime.version, rejected)


def statistics_doc(models: ModelSet, name: str | None, version: str | None) -> dict[str, Any]:
    """Triton's statistics document: every loaded model when ``name`` is empty, else that
    one: the version asked for, or (none asked) each of its loaded versions, oldest first,
    as Triton's; Refused NOT_FOUND for an unknown model, INVALID_ARG for one not loaded."""
    if not name:
        return {"model_stats": [stats_doc(r) for r in models.runtimes()]}
    try:
        entry = models.lookup(name, version)
    except UnknownModel as exc:
        raise Refused(str(exc), Status.NOT_FOUND) from None
    if entry.runtime is None:
        raise Refused(f"model {name!r} is not available: {entry.reason}", Status.INVALID_ARG)
    if version:
        return {"model_stats": [stats_doc(entry.runtime)]}
    loaded = [e for e in models.entries() if e.name == name and e.runtime is not None]
    loaded.sort(key=lambda e: int(e.version) if e.version.isdigit() else -1)
    return {"model_stats": [stats_doc(e.runtime) for e in loaded if e.runtime is not None]}


def triton_config(runtime: ModelRuntime) -> dict[str, Any]:
    """The effective configuration in Triton's JSON form: what the running batcher runs (its
    own config, made by the policy from the model's batching spec and its engine)."""
    own = getattr(runtime, "triton_config_doc", None)  # an ensemble's: its steps, no engine
    if own is not None:
        return own()
    engine, batcher, serving = runtime.engine, runtime.batcher, runtime.serving
    assert engine is not None
    # the batcher is set with the engine; while an unload clears them, the plan's own say
    policy = batcher.name if batcher is not None else serving.policy
    running = batcher.config if batcher is not None else None

    def tensors(specs: Any) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "data_type": config_datatype(s.datatype), "dims": list(s.shape)} for s in specs
        ]

    # an input's format (FORMAT_NCHW) is the config's own word to clients (Triton's image_client)
    formats = {t.name: pb.ModelInput.Format.Name(t.format) for t in runtime.config.input
               if t.format} if runtime.config is not None else {}  # fmt: skip

    def inputs() -> list[dict[str, Any]]:
        """Each input as it runs: with its format, and ``optional`` where a request may omit it."""
        docs = tensors(engine.inputs)
        for doc, spec in zip(docs, engine.inputs, strict=True):
            if spec.name in formats:
                doc["format"] = formats[spec.name]
            if spec.optional:
                doc["optional"] = True
        return docs

    max_batch = running.max_batch_size if running is not None else serving.max_batch_size
    config: dict[str, Any] = {
        "name": runtime.name,
        "platform": runtime.platform or engine.platform,
        "max_batch_size": max_batch if runtime.batching else 0,
        "input": inputs(),
        "output": tensors(engine.outputs),
        "instance_group": instance_groups(runtime, "KIND_GPU" if "cuda" in engine.device else "KIND_CPU"),
        "parameters": {
            "batcher": {"string_value": policy},
            "wattserve_batcher": {"string_value": policy},
        },
    }
    if config["platform"] == "python":  # Triton: a Python model names its backend, platform empty
        config["platform"], config["backend"] = "", "python"
    if policy == DynamicBatcher.name:
        config["dynamic_batching"] = _dynamic_batching(runtime, running)
    if runtime.serving.sequence is not None and runtime.config is not None:
        # a stateful model's, as Triton's JSON writes it (64-bit integers as strings): what runs,
        # since every field kept is honoured; perf_analyzer reads it to send sequences
        config["sequence_batching"] = sequence_batching_doc(runtime.config)
    if getattr(runtime, "response_cache", None) is not None:  # what runs: enabled and a cache configured
        config["response_cache"] = {"enable": True}
    return config


def instance_groups(runtime: ModelRuntime, kind: str) -> list[dict[str, Any]]:
    """The instances as Triton's groups: one per run of instances with the same rate limiter
    (the group's own, shown as Triton shows it, whether ``--rate-limit`` uses it or not)."""
    limits = runtime.serving.rate_limits
    if not limits:
        return [{"count": len(runtime.devices), "kind": kind}]
    runs: list[list[Any]] = []
    for own in limits:
        if runs and runs[-1][0] == own:
            runs[-1][1] += 1
        else:
            runs.append([own, 1])
    groups = []
    for own, count in runs:
        group: dict[str, Any] = {"count": count, "kind": kind}
        if own is not None:
            group["rate_limiter"] = {
                "resources": [
                    {"name": r.name, "global": r.is_global, "count": r.count} for r in own.resources
                ],
                "priority": own.priority,
            }
        groups.append(group)
    return groups


def _dynamic_batching(runtime: ModelRuntime, running: Any) -> dict[str, Any]:
    """Triton's ``dynamic_batching`` from the dynamic batcher's own config (the spec's
    figures while no batcher runs) and the runtime's queue policy."""
    spec, queue = runtime.serving.batching, runtime.queue_policy
    if isinstance(running, DynamicConfig):
        preferred, delay_s = running.preferred_batch_sizes, running.max_queue_delay_s
        levels, queue_size = running.priority_levels, running.max_queue_size
    else:
        preferred, delay_s = spec.preferred_batch_sizes, spec.max_queue_delay_ms / 1e3
        levels, queue_size = spec.priority_levels, spec.max_queue_size
    doc = {
        "preferred_batch_size": list(preferred),
        "max_queue_delay_microseconds": round(delay_s * 1e6),
        "priority_levels": levels,
        "default_priority_level": queue.default_priority,
        "default_queue_policy": {
            "max_queue_size": queue_size,
            "default_timeout_microseconds": round((queue.default_timeout_ms or 0) * 1000),
            "allow_timeout_override": queue.allow_timeout_override,
            "timeout_action": queue.timeout_action.upper(),
        },
    }
    if queue.levels:  # Triton's priority_queue_policy: each level's own
        doc["priority_queue_policy"] = {str(level): _queue_doc(p) for level, p in queue.levels.items()}
    return doc


def _queue_doc(policy: Any) -> dict[str, Any]:
    """One level's queue policy as Triton's JSON writes it."""
    return {
        "max_queue_size": policy.max_queue_size,
        "default_timeout_microseconds": round((policy.default_timeout_ms or 0) * 1000),
        "allow_timeout_override": policy.allow_timeout_override,
        "timeout_action": policy.timeout_action.upper(),
    }
