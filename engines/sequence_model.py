"""A stateful model's engine as its clients see it: control and state tensors hidden, the
sequence's implicit state fed in and kept.

A model served by the sequence batcher has inputs no client sends (the control inputs the
server fills per request, the state inputs) and outputs no client receives (the state
outputs). This wrapper's ``inputs``/``outputs`` are the client's; it takes a batch as its
requests (``RunsRequests``), each carrying its control tensors and its sequence
(``context.sequence``, a ``SequenceTag`` whose ``state`` dict the sequence's requests share),
stacks them, feeds each request its sequence's state (the initial state on START or before
any), runs the model once and keeps each sequence's next state. Requests of one sequence
never run at once (batchers/sequence.py), so a state is read and written by one request at
a time. The state is kept as host arrays (not on the engine's device).

When the direct sequence batcher gives each request its slot's row (``SequenceTag.slot``: its
sequence's slot in this instance, whose batches are formed from its own slots), the model
runs as many rows as the highest slot with a request ready needs (the batch's, or one the
batcher left for another shape: ``SequenceTag.width``), Triton's way: a request at
its slot's row, and in every idle slot's row below a null request: the first request's inputs
and state with the control inputs not ready (``not_ready``: READY, START and END false,
CORRID 0), whose outputs nobody reads and whose state is not kept. ``rows_for`` says how many
rows a batch ran, for the statistics (Triton counts a batch with its null rows).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from wattserve.engines.base import Batch, Engine, EngineUnavailable, TensorSpec
from wattserve.engines.request_engines import RequestInput


@dataclass(frozen=True)
class StateTensors:
    """One implicit state: the input that gets it, the output that gives the next one, and
    its initial value (one row)."""

    input_name: str
    output_name: str
    initial: Callable[[], np.ndarray]


class SequenceModel:
    def __init__(
        self,
        inner: Engine,
        hidden_inputs: Sequence[TensorSpec],
        states: Sequence[StateTensors],
        not_ready: Mapping[str, np.ndarray] | None = None,
        shown: Collection[str] = (),
    ) -> None:
        """``shown``: state outputs the config also lists as outputs, which clients get."""
        self.inner = inner
        self._not_ready = dict(not_ready or {})  # control input -> its one not-ready row
        hidden = {s.name for s in hidden_inputs}
        missing = sorted(hidden - {s.name for s in inner.inputs})
        missing += sorted({s.output_name for s in states} - {s.name for s in inner.outputs})
        if missing:
            raise EngineUnavailable(f"{inner.name}: the model has no tensor {missing} that its "
                                    "sequence_batching names (control_input, state)")  # fmt: skip
        self.inputs = [s for s in inner.inputs if s.name not in hidden]
        self._state_outputs = {s.output_name for s in states} - set(shown)  # hidden from clients
        self.outputs = [s for s in inner.outputs if s.name not in self._state_outputs]
        self._model_inputs = list(inner.inputs)
        self._states = list(states)

    def __getattr__(self, name: str) -> Any:  # name, platform, device, max_batch_size, ...
        return getattr(self.inner, name)

    def infer(self, batch: Batch) -> dict[str, np.ndarray]:
        """Rows with no sequence (warm-up): hidden inputs are zeros (READY false, initial state)."""
        rows = len(next(iter(batch.values()))) if batch else 1
        fed = dict(batch)
        for spec in self._model_inputs:
            if spec.name not in fed and not spec.optional:
                fed[spec.name] = np.zeros((rows, *(max(d, 1) for d in spec.shape)), dtype=spec.dtype)
        return self._public(self.inner.infer(fed))

    def run_requests(self, requests: Sequence[RequestInput]) -> list[dict[str, np.ndarray] | BaseException]:
        """One model call for the batch; if it fails, each request alone (one bad request
        fails alone, and no sequence's state moves on a failed call)."""
        try:
            return list(self._run(requests))
        except Exception as exc:
            if len(requests) == 1:
                return [exc]
        answers: list[dict[str, np.ndarray] | BaseException] = []
        for request in requests:
            try:
                answers.extend(self._run([request]))
            except Exception as exc:
                answers.append(exc)
        return answers

    def rows_for(self, requests: Sequence[RequestInput]) -> int:
        """The rows the model runs for ``requests``: up to the highest slot's row when each
        has its slot's row, else one per request."""
        rows = self._slot_rows([getattr(context, "sequence", None) for _, context, _ in requests])
        return len(requests) if rows is None else rows[0]

    def _slot_rows(self, tags: Sequence[Any]) -> tuple[int, list[int]] | None:
        """(rows, each request's row) when every request has its own slot's row and they fit
        the model's batch; None: the requests' rows, one after another."""
        slots = [getattr(tag, "slot", None) for tag in tags]
        rows = [slot for slot in slots if slot is not None]
        if not rows or len(rows) != len(slots) or len(set(rows)) != len(rows):
            return None
        size = max(max(rows) + 1, *(getattr(tag, "width", 0) for tag in tags))
        if size == len(rows) and rows == list(range(size)):
            return None  # no idle slot below the highest: the plain stack is the same batch
        return (size, rows) if size <= max(1, self.inner.max_batch_size) else None

    def _run(self, requests: Sequence[RequestInput]) -> list[dict[str, np.ndarray]]:
        tags = [getattr(context, "sequence", None) for _, context, _ in requests]
        names = [s.name for s in self._model_inputs if s.name in requests[0][0]]
        slots = self._slot_rows(tags)
        if slots is None:
            at = list(range(len(requests)))
            batch = {name: np.concatenate([inputs[name] for inputs, _, _ in requests]) for name in names}
            for state in self._states:
                batch[state.input_name] = np.concatenate([self._state_of(tag, state) for tag in tags])
        else:  # each at its slot's row; a null request (the first one, not ready) in the others
            size, at = slots
            batch = {}
            for name in names:
                column = [inputs[name] for inputs, _, _ in requests]
                batch[name] = _rows(column, at, size, self._not_ready.get(name, column[0]))
            for state in self._states:
                column = [self._state_of(tag, state) for tag in tags]
                batch[state.input_name] = _rows(column, at, size, column[0])
        outputs = self.inner.infer(batch)
        answers = []
        for i, tag in zip(at, tags, strict=True):
            if tag is not None and tag.state is not None:
                for state in self._states:  # a copy: the batch's output buffer is not kept
                    tag.state[state.input_name] = np.array(outputs[state.output_name][i : i + 1])
            answers.append({k: v[i : i + 1] for k, v in outputs.items() if k not in self._state_outputs})
        return answers

    @staticmethod
    def _state_of(tag: Any, state: StateTensors) -> np.ndarray:
        """The sequence's current state (its initial one on START, or when it has none)."""
        if tag is None or tag.state is None or tag.start or state.input_name not in tag.state:
            return state.initial()
        return tag.state[state.input_name]

    def _public(self, outputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v for k, v in outputs.items() if k not in self._state_outputs}

    def close(self) -> None:
        self.inner.close()


def _rows(column: Sequence[np.ndarray], at: Sequence[int], size: int, null: np.ndarray) -> np.ndarray:
    """``size`` rows: ``column[k]`` (one row each) at row ``at[k]``, ``null`` in the others."""
    out = np.repeat(null[:1], size, axis=0)
    for row, value in zip(at, column, strict=True):
        out[row] = value[0]
    return out
