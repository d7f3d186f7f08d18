"""One instance of a Triton Python model (``model.py``'s ``TritonPythonModel``).

The engine is built, run and closed on one thread: its instance's own engine thread
(``batchers.base.engine_thread``) in the server's process when ``python_model_isolation`` is
thread, or the main thread of the instance's worker process (``stub.py``) when it is process
(see docs/architecture.md, "Python models: a process per instance"): ``initialize(args)``
when built, ``execute(requests)`` once per batch the batcher formed (``run_requests``: each
request whole), ``finalize()`` when closed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import itertools
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from wattserve.batchers.status import Status
from wattserve.batchers.types import RequestError
from wattserve.engines.base import TensorSpec
from wattserve.engines.python_backend import custom_metrics, pb_utils
from wattserve.engines.ragged import BatchInput, with_batch_inputs
from wattserve.engines.request_engines import ModelCaller, RequestInput

log = logging.getLogger("wattserve.python_backend")

MODEL_CLASS = "TritonPythonModel"
_modules = itertools.count()
# TritonError codes -> the neutral status kinds the front ends map (UNKNOWN is INTERNAL)
CODE_STATUS = {
    pb_utils.TritonError.INTERNAL: Status.INTERNAL,
    pb_utils.TritonError.NOT_FOUND: Status.NOT_FOUND,
    pb_utils.TritonError.INVALID_ARG: Status.INVALID_ARG,
    pb_utils.TritonError.UNAVAILABLE: Status.UNAVAILABLE,
    pb_utils.TritonError.UNSUPPORTED: Status.UNSUPPORTED,
    pb_utils.TritonError.ALREADY_EXISTS: Status.ALREADY_EXISTS,
    pb_utils.TritonError.CANCELLED: Status.CANCELLED,
}
DECOUPLED_UNARY = ("ModelInfer and the HTTP infer endpoint don't support models with decoupled transaction "
                   "policy; use the gRPC stream (ModelStreamInfer)")  # fmt: skip


class ModelFailed(RequestError):
    """A Python model's error for one request: its message and status kind (a TritonError's
    code, INTERNAL for an exception raised in ``execute``)."""

    outcome = "error"

    def __init__(self, message: str, status: Status = Status.INTERNAL) -> None:
        super().__init__(message)
        self.status = status

    @classmethod
    def of(cls, error: pb_utils.TritonError) -> ModelFailed:
        return cls(error.message(), CODE_STATUS.get(error.code(), Status.INTERNAL))


def register_module() -> None:
    """Make ``import triton_python_backend_utils`` find ours (Triton's top-level name)."""
    sys.modules.setdefault(pb_utils.MODULE_NAME, pb_utils)


def load_model_module(path: Path) -> ModuleType:
    """Import ``model.py`` under a name of its own (two models' files never collide); its
    folder goes on ``sys.path`` so helper modules beside it import, as under Triton."""
    register_module()
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)
    name = f"wattserve_python_model_{next(_modules)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    if not inspect.isclass(getattr(module, MODEL_CLASS, None)):
        raise ImportError(f"{path} defines no class {MODEL_CLASS}")
    return module


@dataclass(frozen=True)
class PythonModelFile:
    """What the repository says about one Python model version (from its config)."""

    path: Path  # <repo>/<model>/<version>/model.py
    name: str
    version: str
    config: dict[str, Any]  # the model's config as Triton's JSON (protobuf field names)
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batching: bool  # False: max_batch_size 0 (no batch axis in requests)
    max_batch_size: int
    decoupled: bool
    batch_inputs: tuple[BatchInput, ...] = ()  # Triton's batch_input: given to the first request


class PythonModelEngine:
    """A ``TritonPythonModel`` instance; ``RunsRequests``, ``CallsModels``, ``WarmsItself``."""

    platform = "python"

    def __init__(self, model: PythonModelFile, *, device: str = "cpu", instance: int = 0) -> None:
        self.model = model
        self.name = model.name
        self.inputs = model.inputs
        self.outputs = model.outputs
        self.max_batch_size = model.max_batch_size
        self.batch_sizes = None
        self.device = device
        self._outputs = {spec.name: spec for spec in model.outputs}
        self._all_outputs = [spec.name for spec in model.outputs]
        self._caller: ModelCaller | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # for an ``async def execute``
        # its custom metrics (pb_utils.MetricFamily), released when it closes
        self._metrics = custom_metrics.Owner(custom_metrics.bound_store())
        custom_metrics.bind(self._metrics)
        module = load_model_module(model.path)
        self.instance = getattr(module, MODEL_CLASS)()
        kind = "GPU" if device.startswith("cuda") else "CPU"
        args = {
            "model_config": json.dumps(model.config),
            "model_instance_kind": kind,
            "model_instance_name": f"{model.name}_0_{instance}",
            "model_instance_device_id": device.partition(":")[2] or "0",
            "model_repository": str(model.path.parent.parent),
            "model_version": model.version,
            "model_name": model.name,
        }
        initialize = getattr(self.instance, "initialize", None)
        if initialize is not None:
            self._run(initialize(args))
        self._async_execute = inspect.iscoroutinefunction(self.instance.execute)

    # ------------------------------------------------------------------ capabilities
    def bind_models(self, call: ModelCaller) -> None:
        self._caller = call
        pb_utils.bind_caller(call)

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """Nothing: Triton calls ``execute`` only for real requests (or a config's
        ``model_warmup`` samples, which the repository's engine factory runs:
        server/models/repository/warmup.py)."""

    def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A batch of rows as one request (for callers that know no requests)."""
        (answer,) = self.run_requests([(batch, None, _never)])
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def close(self) -> None:
        finalize = getattr(self.instance, "finalize", None)
        custom_metrics.bind(self._metrics, thread_only=True)
        try:
            if finalize is not None:
                self._run(finalize())
        finally:
            self._metrics.release()  # its series leave /metrics with it, as a stub's do
            if self._loop is not None:
                self._loop.close()
                self._loop = None

    # ------------------------------------------------------------------ execute
    def run_requests(self, requests: Sequence[RequestInput]) -> list[dict[str, np.ndarray] | BaseException]:
        """One ``execute`` call for the whole batch; each request answered on its own. An
        exception from ``execute`` fails every request of the batch with its message."""
        pb_utils.bind_caller(self._caller, thread_only=True)
        custom_metrics.bind(self._metrics, thread_only=True)
        if self.model.batch_inputs:
            requests = with_batch_inputs(requests, self.model.batch_inputs)
        built = [self._request(*request) for request in requests]
        answers: list[dict[str, np.ndarray] | BaseException | None] = [None] * len(requests)
        if self.model.decoupled:
            for i, (_, context, *_) in enumerate(requests):
                if getattr(context, "response_sink", None) is None:
                    answers[i] = ModelFailed(DECOUPLED_UNARY, Status.UNSUPPORTED)
        todo = [i for i, answer in enumerate(answers) if answer is None]
        if not todo:
            return [a for a in answers if a is not None]
        try:
            responses = self._run(self.instance.execute([built[i] for i in todo]))
        except Exception as exc:
            log.warning("model %r: execute raised %s: %s", self.name, type(exc).__name__, exc)
            failure = ModelFailed(f"Failed to process the request(s) for model '{self.name}', message: "
                                  f"{type(exc).__name__}: {exc}")  # fmt: skip
            if isinstance(exc, pb_utils.TritonError):
                failure = ModelFailed.of(exc)
            for i in todo:
                answers[i] = failure
            return answers  # type: ignore[return-value]
        if self.model.decoupled:
            for i in todo:
                answers[i] = {}  # answered through the response sender (the stream)
            return answers  # type: ignore[return-value]
        if not isinstance(responses, list | tuple) or len(responses) != len(todo):
            got = len(responses) if isinstance(responses, list | tuple) else type(responses).__name__
            failure = ModelFailed(f"model '{self.name}': execute returned {got} responses for {len(todo)} "
                                  "requests (one InferenceResponse per request)")  # fmt: skip
            for i in todo:
                answers[i] = failure
            return answers  # type: ignore[return-value]
        for i, response in zip(todo, responses, strict=True):
            inputs = requests[i][0]
            answers[i] = self._answer(response, built[i].requested_output_names(), _rows(inputs))
        return answers  # type: ignore[return-value]

    def _run(self, value: Any) -> Any:
        """A coroutine (an ``async def`` lifecycle method) runs to completion on this
        thread's own loop; anything else is already the answer."""
        if not inspect.iscoroutine(value):
            return value
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(value)

    def _request(
        self, inputs: Mapping[str, np.ndarray], context: Any, cancelled: Callable[[], bool] = bool
    ) -> pb_utils.InferenceRequest:
        batching = self.model.batching
        tensors = [pb_utils.Tensor(name, value if batching else value[0]) for name, value in inputs.items()]
        wanted = getattr(context, "outputs", None) or self._all_outputs
        parameters = getattr(context, "parameters", None)
        sequence = getattr(context, "sequence", None)  # a stateful model's: its ID and START/END flags
        request = pb_utils.InferenceRequest(
            model_name=self.name,
            inputs=tensors,
            requested_output_names=wanted,
            request_id=getattr(context, "id", None) or "",
            model_version=int(self.model.version),
            parameters=parameters if isinstance(parameters, dict | str) else None,
            correlation_id=sequence.correlation_id if sequence is not None else 0,
            flags=sequence.flags if sequence is not None else 0,
        )
        request._cancelled = cancelled
        sink = getattr(context, "response_sink", None)
        if self.model.decoupled and sink is not None:
            stream_gone = getattr(context, "response_cancelled", None) or bool
            request._sender = pb_utils.InferenceResponseSender(
                self._deliver_to(sink, wanted, _rows(inputs)), lambda: cancelled() or stream_gone()
            )
        return request

    def _deliver_to(self, sink: Any, wanted: list[str], rows: int) -> Any:
        def deliver(response: pb_utils.InferenceResponse | None, flags: int) -> None:
            final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if response is None:
                sink(None, None, final)
                return
            answer = self._answer(response, wanted, rows)
            if isinstance(answer, BaseException):
                sink(None, answer, final)
            else:
                sink(answer, None, final)

        return deliver

    def _answer(self, response: Any, wanted: list[str], rows: int) -> dict[str, np.ndarray] | BaseException:
        """One response -> the request's outputs (batch axis first), or its error."""
        if not isinstance(response, pb_utils.InferenceResponse):
            return ModelFailed(f"model '{self.name}': execute returned a {type(response).__name__} where an "
                               "InferenceResponse belongs")  # fmt: skip
        error = response.error()
        if error is not None:
            return ModelFailed.of(error)
        produced = {t.name(): t.as_numpy() for t in response.output_tensors()}
        outputs: dict[str, np.ndarray] = {}
        for name in wanted:
            spec = self._outputs.get(name)
            if spec is None:
                return ModelFailed(f"model '{self.name}' has no output '{name}'")
            if name not in produced:  # as Triton's Python backend: the answer lacks it (an
                continue  # ensemble's next step may take it as an absent optional input)
            value = np.asarray(produced[name])
            if spec.datatype == "BYTES":
                value = pb_utils.as_bytes_array(value)
            elif value.dtype != spec.dtype:
                value = value.astype(spec.dtype)
            if not self.model.batching:
                value = value[np.newaxis]
            elif value.ndim == 0 or len(value) != rows:
                shape = list(value.shape)
                return ModelFailed(f"model '{self.name}': output '{name}' has shape {shape} for a "
                                   f"request of {rows} row(s) (batch axis first)")  # fmt: skip
            outputs[name] = value
        return outputs


def _never() -> bool:
    return False


def _rows(inputs: Mapping[str, np.ndarray]) -> int:
    for value in inputs.values():
        return len(value) if value.ndim else 1
    return 1
