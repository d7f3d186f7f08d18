"""A Triton ensemble's dataflow graph: read from ``ensemble_scheduling``, checked, planned.

Pure (no server state), so every check is a unit test. Two kinds of checks, with Triton's
words (qa/L0_model_config/autofill_noplatform/ensemble/*/expected) and the step named:

- ``parse_graph``: what the config alone says (steps, maps, every tensor produced once and
  used, the ensemble's inputs used and outputs written, no cycle);
- ``check_against_models``: what needs the composing models (their tensor names, datatypes
  and shapes, batch sizes), once they are loaded.

Steps are numbered from 0, as Triton's messages number them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from wattserve.engines.base import VARIABLE, TensorSpec
from wattserve.server.models.repository.config import ConfigError


@dataclass(frozen=True)
class Step:
    """One ``ensemble_scheduling.step``: which model, and its tensors' ensemble names."""

    index: int
    model: str
    version: str | None  # None: the model's newest ready version (Triton's -1)
    input_map: Mapping[str, str]  # the model's input -> the ensemble tensor feeding it
    output_map: Mapping[str, str]  # the model's output -> the ensemble tensor it writes

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model}')"


@dataclass(frozen=True, eq=False)
class EnsembleGraph:
    name: str
    inputs: tuple[str, ...]  # the ensemble's own inputs (its config's ``input``)
    outputs: tuple[str, ...]
    steps: tuple[Step, ...]
    producer: dict[str, Step] = field(default_factory=dict)  # ensemble tensor -> the step writing it

    def models(self) -> list[tuple[str, str | None]]:
        """The composing (model, version) pairs, each once, in step order."""
        return list(dict.fromkeys((s.model, s.version) for s in self.steps))

    def plan(self, wanted: Sequence[str] | None) -> tuple[Step, ...]:
        """The steps needed for the ``wanted`` outputs (all: None), in step order. Like Triton,
        a request for some outputs runs only the steps they depend on."""
        return _plan(self, tuple(wanted) if wanted else self.outputs)


@lru_cache(maxsize=256)
def _plan(graph: EnsembleGraph, wanted: tuple[str, ...]) -> tuple[Step, ...]:
    needed: set[int] = set()
    stack = [graph.producer[t] for t in wanted if t in graph.producer]
    while stack:
        step = stack.pop()
        if step.index in needed:
            continue
        needed.add(step.index)
        stack += [graph.producer[t] for t in step.input_map.values() if t in graph.producer]
    return tuple(s for s in graph.steps if s.index in needed)


def parse_graph(config: Any, source: str, name: str | None = None) -> EnsembleGraph:
    """The graph of an ensemble's config (a ``ModelConfig``); ConfigError naming the step for
    anything Triton refuses at load without looking at the composing models. ``name``: the
    model's (its directory's) name, else the config's."""
    name = name or config.name or source
    if not config.HasField("ensemble_scheduling"):
        raise ConfigError(f"{source}: ensemble scheduling must be set for ensemble {name} whose "
                          "platform is ensemble")  # fmt: skip
    if config.backend:
        raise ConfigError(f"{source}: Ensemble model '{name}' must have platform type 'ensemble' and "
                          "empty backend type")  # fmt: skip
    for what, present in (("instance group", bool(config.instance_group)),
                          ("optimization", config.HasField("optimization")),
                          ("model_warmup", bool(config.model_warmup))):  # fmt: skip
        if present:
            raise ConfigError(f"{source}: {what} should not be specified for ensemble '{name}'")
    if not config.input or not config.output:
        raise ConfigError(f"{source}: ensemble '{name}' must declare its 'input' and 'output' tensors")
    if not config.ensemble_scheduling.step:
        raise ConfigError(f"{source}: must specify 'step' for ensemble '{name}'")
    steps = []
    for i, s in enumerate(config.ensemble_scheduling.step):
        for what, present in (("model_name", s.model_name), ("input_map", s.input_map),
                              ("output_map", s.output_map)):  # fmt: skip
            if not present:
                raise ConfigError(f"{source}: must specify '{what}' in step {i} of ensemble '{name}'")
        version = str(s.model_version) if s.model_version >= 0 else None
        steps.append(Step(i, s.model_name, version, dict(s.input_map), dict(s.output_map)))
    graph = EnsembleGraph(
        name, tuple(t.name for t in config.input), tuple(t.name for t in config.output), tuple(steps)
    )
    _check_dataflow(graph, source)
    return graph


def _check_dataflow(graph: EnsembleGraph, source: str) -> None:
    name, inputs = graph.name, set(graph.inputs)
    for step in graph.steps:
        if step.model == name:
            raise ConfigError(f"{source}: circular dependency between ensembles: {name} -> ... -> {name} "
                              f"-> {name} ({step.label})")  # fmt: skip
        for tensor in step.output_map.values():
            if tensor in inputs:
                raise ConfigError(f"{source}: in ensemble {name}, {step.label} writes ensemble tensor "
                                  f"'{tensor}', which is an input of the ensemble")  # fmt: skip
            if tensor in graph.producer:
                raise ConfigError(f"{source}: ensemble tensor '{tensor}' can appear in an output map only "
                                  f"once for ensemble '{name}' ({graph.producer[tensor].label} and "
                                  f"{step.label})")  # fmt: skip
            graph.producer[tensor] = step
    consumed: set[str] = set()
    for step in graph.steps:
        for model_input, tensor in step.input_map.items():
            consumed.add(tensor)
            if tensor not in inputs and tensor not in graph.producer:
                raise ConfigError(f"{source}: in ensemble {name}, {step.label}: input '{model_input}' reads "
                                  f"ensemble tensor '{tensor}', which no step writes and the ensemble "
                                  "does not take as input")  # fmt: skip
    for tensor in graph.inputs:
        if tensor not in consumed:
            raise ConfigError(f"{source}: ensemble input '{tensor}' for ensemble '{name}' is not used")
    for tensor in graph.outputs:
        if tensor not in graph.producer:
            raise ConfigError(f"{source}: output '{tensor}' for ensemble '{name}' is not written")
    for tensor, step in graph.producer.items():
        if tensor not in consumed and tensor not in graph.outputs:
            raise ConfigError(f"{source}: ensemble tensor '{tensor}' is unused in ensemble '{name}' "
                              f"(written by {step.label})")  # fmt: skip
    cycle = _cycle(graph)
    if cycle:
        path = " -> ".join(s.label for s in cycle)
        raise ConfigError(f"{source}: in ensemble {name}, the steps form a cycle: {path}")


def _cycle(graph: EnsembleGraph) -> list[Step]:
    """A cycle of steps (the first step repeated at its end), or [] when the graph is acyclic."""
    after = {s.index: [graph.producer[t] for t in s.input_map.values() if t in graph.producer]
             for s in graph.steps}  # fmt: skip  # step -> the steps it waits for
    state: dict[int, int] = {}  # 1: on the current path, 2: done
    path: list[Step] = []

    def visit(step: Step) -> list[Step]:
        state[step.index] = 1
        path.append(step)
        for before in after[step.index]:
            if state.get(before.index) == 1:
                return [*path[path.index(before) :], before]
            if before.index not in state and (found := visit(before)):
                return found
        state[step.index] = 2
        path.pop()
        return []

    for step in graph.steps:
        if step.index not in state and (found := visit(step)):
            return list(reversed(found))
    return []


# ---------------------------------------------------------------------------- composing models


@dataclass(frozen=True)
class ModelView:
    """What the checks need of a loaded composing model."""

    name: str
    inputs: Sequence[TensorSpec]  # as its clients see them (after reshape)
    outputs: Sequence[TensorSpec]
    max_batch: int  # 0: its requests carry no batch axis


def _full_shape(spec: TensorSpec, batched: bool) -> tuple[int, ...]:
    return ((VARIABLE,) if batched else ()) + tuple(spec.shape)


def _agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(VARIABLE in (x, y) or x == y for x, y in zip(a, b, strict=True))


def _dims(shape: Iterable[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def check_against_models(
    graph: EnsembleGraph,
    max_batch: int,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    views: Mapping[int, ModelView],
) -> None:
    """ConfigError naming the step for a tensor map that names no tensor of its model, a
    model input left unmapped, a batch size the model cannot take, or an ensemble tensor
    whose datatype or shape differs between the places that define it. ``views``: step
    index -> its model; ``max_batch``, ``inputs``, ``outputs``: the ensemble's own."""
    name = graph.name
    # ensemble tensor -> (datatype, shape with the batch axis where requests carry one, who said so)
    seen: dict[str, tuple[str, tuple[int, ...], str]] = {}

    def define(tensor: str, spec: TensorSpec, batched: bool, who: str, step: Step | None) -> None:
        shape = _full_shape(spec, batched)
        if tensor not in seen:
            seen[tensor] = (spec.datatype, shape, who)
            return
        datatype, known, first = seen[tensor]
        where = f"in ensemble {name}" + (f", {step.label}" if step else "")
        if datatype != spec.datatype:
            raise ConfigError(f"{where}: ensemble tensor {tensor}: inconsistent data type: TYPE_{datatype} "
                              f"is inferred from {first} while TYPE_{spec.datatype} is inferred from "
                              f"{who}")  # fmt: skip
        if not _agree(known, shape):
            raise ConfigError(f"{where}: ensemble tensor {tensor}: inconsistent shape: {_dims(known)} "
                              f"is inferred from {first} while {_dims(shape)} is inferred from "
                              f"{who}")  # fmt: skip

    batched = max_batch > 0
    for spec in (*inputs, *outputs):
        define(spec.name, spec, batched, f"model {name}", None)
    for step in graph.steps:
        view = views[step.index]
        if batched and view.max_batch and max_batch > view.max_batch:
            raise ConfigError(f"ensemble {name} allows maximum batch size {max_batch}, but it contains "
                              f"model {view.name} which only allows maximum batch size to be "
                              f"{view.max_batch} ({step.label})")  # fmt: skip
        for mapping, specs, what in ((step.input_map, view.inputs, "input"),
                                     (step.output_map, view.outputs, "output")):  # fmt: skip
            by_name = {s.name: s for s in specs}
            for key, tensor in mapping.items():
                if key not in by_name:
                    verb = "is mapping to" if what == "input" else "is mapped from"
                    raise ConfigError(f"in ensemble {name}, {step.label}: ensemble tensor {tensor} {verb} "
                                      f"non-existing {what} {key} in model {view.name}")  # fmt: skip
                define(tensor, by_name[key], view.max_batch > 0, f"model {view.name}", step)
        for spec in view.inputs:
            if spec.name not in step.input_map and not spec.optional:  # an optional one may be left out
                raise ConfigError(f"in ensemble {name}, {step.label}: input {spec.name} in model "
                                  f"{view.name} is not mapped to any ensemble tensors")  # fmt: skip


# ---------------------------------------------------------------------------- planning


def ensemble_plans(config: Any, model_dir: Any, base: Any, source: str) -> list[Any]:
    """The plans of an ensemble's versions (``platform: "ensemble"`` in a repository): its
    graph checked now, its composing models when it starts (``server.models.ensemble``)."""
    from wattserve.server.models.plan import ModelPlan
    from wattserve.server.models.repository.config import check_supported, select_versions
    from wattserve.server.models.serving_config import ServingConfig

    graph = parse_graph(config, source, model_dir.name)
    if config.max_batch_size < 0:
        raise ConfigError(f"{source}: field 'max_batch_size' must be >= 0")
    warnings = check_supported(config, "ensemble", source, base.allow_unsupported_config)
    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    chosen = select_versions(config, versions or [1])  # Triton wants the folder; it holds nothing
    if not chosen:
        raise ConfigError(f"{model_dir}: no version folder matches the version policy (found {versions})")
    update = {"model": graph.name, "max_batch_size": max(1, config.max_batch_size)}
    serving = ServingConfig.from_settings(base.model_copy(update=update), devices=["cpu"], steps=False)
    if config.response_cache.enable:  # its own requests cached (a decoupled step: refused when it starts)
        serving = replace(serving, response_cache=True)

    for warning in warnings:
        logging.getLogger("wattserve.repository").warning("%s", warning)

    def no_engine(_config: Any) -> Any:
        raise AssertionError("an ensemble has no engine")

    return [ModelPlan(graph.name, str(v), serving, no_engine, batching=config.max_batch_size > 0,
                      platform="ensemble", warnings=warnings, config=config) for v in chosen]  # fmt: skip
