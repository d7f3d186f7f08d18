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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
        self, inner: Engine, hidden_inputs: Sequence[TensorSpec], states: Sequence[StateTensors]
    ) -> None:
        self.inner = inner
        hidden = {s.name for s in hidden_inputs}
        missing = sorted(hidden - {s.name for s in inner.inputs})
        missing += sorted({s.output_name for s in states} - {s.name for s in inner.outputs})
        if missing:
            raise EngineUnavailable(f"{inner.name}: the model has no tensor {missing} that its "
                                    "sequence_batching names (control_input, state)")  # fmt: skip
        self.inputs = [s for s in inner.inputs if s.name not in hidden]
        self._state_outputs = {s.output_name for s in states}
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

    def _run(self, requests: Sequence[RequestInput]) -> list[dict[str, np.ndarray]]:
        tags = [getattr(context, "sequence", None) for _, context, _ in requests]
        names = [s.name for s in self._model_inputs if s.name in requests[0][0]]
        batch = {name: np.concatenate([inputs[name] for inputs, _, _ in requests]) for name in names}
        for state in self._states:
            batch[state.input_name] = np.concatenate([self._state_of(tag, state) for tag in tags])
        outputs = self.inner.infer(batch)
        answers = []
        for i, tag in enumerate(tags):
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
