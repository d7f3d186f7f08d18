"""How a stateful model's plan differs: its batcher's settings, and an engine whose control and
state tensors are checked against the model file but hidden from clients."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import asdict, replace

from wattserve.batchers.sequence import DelayHook, SequenceBatchingSpec
from wattserve.engines.base import Engine, TensorSpec
from wattserve.engines.config import EngineConfig
from wattserve.engines.sequence_model import SequenceModel, StateTensors
from wattserve.server.models.plan import EngineFactory
from wattserve.server.models.repository.sequence_config import SequenceModelSpec
from wattserve.server.models.serving_config import ServingConfig

log = logging.getLogger("wattserve.models")

# Triton's debug hooks for its sequence batcher, read where Triton's core reads them (at load)
DELAY_VARIABLE = "TRITONSERVER_DELAY_SCHEDULER"
BACKLOG_VARIABLE = "TRITONSERVER_BACKLOG_DELAY_SCHEDULER"


def delay_hook(environ: Mapping[str, str] | None = None) -> DelayHook:
    """Triton's ``TRITONSERVER_DELAY_SCHEDULER`` / ``TRITONSERVER_BACKLOG_DELAY_SCHEDULER``
    from the environment, read as Triton's core reads them (C's ``atoi``: a number, else 0)."""
    environ = os.environ if environ is None else environ
    hook = DelayHook(_atoi(environ.get(DELAY_VARIABLE)), _atoi(environ.get(BACKLOG_VARIABLE)))
    if hook.active:
        log.info(
            "%s=%d, %s=%d: sequence models hold their first batch until that many requests wait "
            "(Triton's debug hook)",
            *(DELAY_VARIABLE, hook.queued, BACKLOG_VARIABLE, hook.backlog),
        )
    return hook


def _atoi(text: str | None) -> int:
    """C's ``atoi``: the leading decimal number of ``text`` after blanks, 0 if none; a
    negative one is taken as 0 (no hold; in Triton's size_t it would hold for ever)."""
    match = re.match(r"\s*([+-]?\d+)", text or "")
    return max(0, int(match.group(1))) if match else 0


def sequence_serving(serving: ServingConfig, sequence: SequenceModelSpec) -> ServingConfig:
    """The serving config with the sequence batcher's knobs (the strategy's delay, direct's
    slot utilization, oldest's candidate sequences and preferred sizes, the idle timeout, and
    Triton's delay hook from the environment) and the spec the runtime fills control inputs
    from."""
    batching = SequenceBatchingSpec(
        **{
            **asdict(serving.batching),
            "batcher": "sequence_oldest" if sequence.strategy == "oldest" else "sequence",
            "max_queue_delay_ms": sequence.max_queue_delay_ms,
            "preferred_batch_sizes": sequence.preferred_batch_sizes,
        },
        min_slot_utilization=sequence.min_slot_utilization,
        sequence_idle_s=sequence.idle_s,
        slots=sequence.slots,
        delay=delay_hook(),
    )
    return replace(serving, batching=batching, sequence=sequence)


def with_hidden(
    sequence: SequenceModelSpec,
    in_outer: list[TensorSpec],
    in_inner: list[TensorSpec],
    out_outer: list[TensorSpec],
    out_inner: list[TensorSpec],
) -> tuple[list[TensorSpec], list[TensorSpec], list[TensorSpec], list[TensorSpec]]:
    """The config's tensors with the control and state ones the model file also has (when
    the config declares tensors at all: else the file's own are taken). A state output the
    config also lists among its outputs is there once (clients may ask for it, as Triton
    lets them)."""
    hidden_in = sequence.hidden_inputs()
    declared = {s.name for s in out_outer}
    hidden_out = [s for s in sequence.hidden_outputs() if s.name not in declared]
    if in_inner:
        in_outer, in_inner = in_outer + hidden_in, in_inner + hidden_in
    if out_inner:
        out_outer, out_inner = out_outer + hidden_out, out_inner + hidden_out
    return in_outer, in_inner, out_outer, out_inner


def sequence_factory(
    build: EngineFactory, sequence: SequenceModelSpec, declared_outputs: Collection[str] = ()
) -> EngineFactory:
    """Each instance built by ``build``, wrapped as its clients see it (``SequenceModel``):
    the state outputs hidden but those the config lists among its outputs."""
    states = [StateTensors(s.input_name, s.output_name, s.initial) for s in sequence.states]
    hidden = sequence.hidden_inputs()
    not_ready = sequence.not_ready()

    def built(config: EngineConfig) -> Engine:
        return SequenceModel(build(config), hidden, states, not_ready, shown=declared_outputs)

    return built
