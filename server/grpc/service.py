"""KServe v2 over gRPC: Triton's ``inference.GRPCInferenceService`` on ``grpc.aio``.

A front end over the protocol-neutral core (``server/core/``), translating protobuf to
and from it and nothing more: it runs in the HTTP server's process and event loop and
reaches the models only through the ``ModelSet`` and the core's one admission path
(``server.core.admission.admit``: lookup, readiness and queue room, decode + validate,
submit; decoding by ``server.core.decode.InferenceDecoder`` with this module's protobuf
reader), so an HTTP and a gRPC request may ride in the same batch, and a request is refused
for the same reasons whichever protocol carried it. It imports nothing from the HTTP front
end (``server/http/routes/``). The messages are the generated ones that ship in Triton's client
package.

Refusals keep HTTP's meaning, mapped to gRPC codes as Triton does (``GRPC_CODES``); 503s
carry ``retry-after`` (seconds) and ``grpc-retry-pushback-ms`` in the trailing metadata.
A client that goes away (or whose gRPC deadline passes) cancels its handler; the batcher
then drops the item, so a request still queued is never computed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from wattserve.batchers.status import Status
from wattserve.server.core.admission import (
    TIMING_NAMES,
    ModelUnavailable,
    Refused,
    admit,
    select,
    timing_values,
)
from wattserve.server.core.decode import OFFLOAD_DECODE_BYTES, BodyBudget, BudgetExceeded, InferenceDecoder
from wattserve.server.core.decoupled import ResponseStream, is_decoupled
from wattserve.server.core.documents import (
    metadata_doc,
    server_doc,
    serving_runtime,
    statistics_doc,
    triton_config,
)
from wattserve.server.core.request import BadRequest, check_tensor_header
from wattserve.server.core.token_stream import stream_wanted, token_sink
from wattserve.server.extensions.errors import ExtensionError
from wattserve.server.extensions.shared_memory import SharedMemoryRegistry
from wattserve.server.extensions.trace_logging import LogSettings, TraceSettings, check_model_ready
from wattserve.server.grpc.access import GrpcAccessControl
from wattserve.server.grpc.codec import build_response, parse_grpc_request, payload_bytes
from wattserve.server.grpc.wire import RequestPeek, WireError, peek_request
from wattserve.server.models.metrics import request_protocol
from wattserve.server.models.model_set import (
    ModelControlRefused,
    ModelLoadError,
    ModelSet,
    ModelState,
    UnknownModel,
    load_failure,
)
from wattserve.server.models.repository.override import (
    FILE_PREFIX,
    LoadOverride,
    OverrideError,
    parse_override,
)
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.security import Restriction
from wattserve.server.settings import Settings

log = logging.getLogger("wattserve.grpc")

S = grpc.StatusCode
GRPC_CODES = {  # the gRPC front end's one table: status kind -> Triton's gRPC code for it
    Status.INVALID_ARG: S.INVALID_ARGUMENT,
    Status.NOT_FOUND: S.NOT_FOUND,
    Status.UNAVAILABLE: S.UNAVAILABLE,
    Status.UNSUPPORTED: S.UNIMPLEMENTED,
    Status.INTERNAL: S.INTERNAL,
    Status.CANCELLED: S.CANCELLED,
    Status.ALREADY_EXISTS: S.ALREADY_EXISTS,
    Status.TOO_LARGE: S.RESOURCE_EXHAUSTED,
    Status.UNSUPPORTED_MEDIA: S.INVALID_ARGUMENT,
    Status.UNAUTHENTICATED: S.UNAUTHENTICATED,
    Status.PERMISSION_DENIED: S.PERMISSION_DENIED,
}
STREAM_INFLIGHT = 1024  # requests one stream may have unanswered; past it the stream stops reading


class Failure(Exception):
    """A gRPC error answer: code, message, and whether to send retry information."""

    def __init__(self, code: grpc.StatusCode, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retry = retry

    @classmethod
    def of(cls, refused: Refused) -> Failure:
        return cls(GRPC_CODES.get(refused.status, S.UNKNOWN), str(refused), refused.retry_after)


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Every RPC of the KServe v2 / Triton gRPC protocol that the HTTP side has."""

    def __init__(
        self,
        models: ModelSet,
        settings: Settings,
        body_budget: BodyBudget,
        shm: SharedMemoryRegistry | None = None,
        trace: TraceSettings | None = None,
        log: LogSettings | None = None,
    ) -> None:
        self.models = models
        self.settings = settings
        self.body_budget = body_budget
        self.shm = shm if shm is not None else SharedMemoryRegistry(settings.allow_client_shm)
        self.trace = trace if trace is not None else TraceSettings()
        self.log = log if log is not None else LogSettings(settings.log_level)
        self.retry_metadata = (
            ("retry-after", str(settings.retry_after_s)),
            ("grpc-retry-pushback-ms", str(settings.retry_after_s * 1000)),
        )
        self._streams: set[asyncio.Queue[Any]] = set()  # open streams' answer queues
        self._decode = InferenceDecoder(self._read, parse_grpc_request, body_budget, self.shm)

    # ------------------------------------------------------------------ health and metadata
    async def ServerLive(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.models.ready)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        """Ready or not; an unknown model is simply not ready (Triton's answer, and what
        ``tritonclient``'s ``is_model_ready`` expects)."""
        try:
            entry = self.models.lookup(request.name, request.version or None)
        except UnknownModel:
            return service_pb2.ModelReadyResponse(ready=False)
        runtime = entry.runtime
        ready = entry.state is ModelState.READY and runtime is not None and runtime.ready
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return service_pb2.ServerMetadataResponse(**server_doc())

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        runtime = await self._serving(request.name, request.version, context)
        return json_format.ParseDict(metadata_doc(self.models, runtime), service_pb2.ModelMetadataResponse())

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        """The configuration HTTP's ``/config`` returns, as Triton's ModelConfig message."""
        runtime = await self._serving(request.name, request.version, context)
        config = json_format.ParseDict(triton_config(runtime), model_config_pb2.ModelConfig())
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:
        """HTTP's ``/stats`` numbers; no name: every loaded model (as Triton)."""
        try:
            doc = statistics_doc(self.models, request.name, request.version or None)
        except Refused as refused:
            await self._abort(context, Failure.of(refused))
        return json_format.ParseDict(doc, service_pb2.ModelStatisticsResponse())

    # ------------------------------------------------------------------ repository extension
    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        response = service_pb2.RepositoryIndexResponse()
        for doc in self.models.index(ready_only=request.ready):
            response.models.add(**doc)
        return response

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        """Triton's load, with its ``config`` (string_param) and ``file:`` (bytes_param)
        overrides; refused outside explicit mode (UNAVAILABLE, Triton's message)."""
        name = request.model_name
        try:
            self.models.check_control()
            override = grpc_override(name, request.parameters)
            entries = await self.models.load(name, override)
        except ModelControlRefused as exc:
            await self._abort(context, Failure(S.UNAVAILABLE, str(exc)))
        except OverrideError as exc:
            await self._abort(context, Failure(S.INVALID_ARGUMENT, str(exc)))
        except UnknownModel as exc:
            await self._abort(context, Failure(S.NOT_FOUND, str(exc)))
        except ModelLoadError as exc:
            await self._abort(context, Failure(S.UNAVAILABLE, str(exc), retry=True))
        failure = load_failure(name, entries)
        if failure:
            await self._abort(context, Failure(S.INVALID_ARGUMENT, failure))
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        try:
            await self.models.unload(request.model_name)
        except ModelControlRefused as exc:
            await self._abort(context, Failure(S.UNAVAILABLE, str(exc)))
        except UnknownModel as exc:
            await self._abort(context, Failure(S.NOT_FOUND, str(exc)))
        return service_pb2.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------------ inference
    async def ModelInfer(self, raw: bytes, context: Any) -> Any:
        """``raw``: the serialized request (registered without a deserializer: ``_receive``
        refuses what cannot be served before parsing it)."""
        request_protocol.set("grpc")  # this handler's own task: the metrics' protocol label
        failure = None
        try:
            request, runtime, reserved = await self._receive(raw)
            try:
                response, result = await self._infer(request, runtime)
            finally:
                self.body_budget.release(reserved)
        except Failure as caught:  # a fresh exception: the caught one's traceback holds ``raw``
            failure = Failure(caught.code, str(caught), caught.retry)
        if failure is not None:
            # abort raises out of this frame; whatever keeps that exception (grpc.aio, until the
            # cyclic collector runs) must not keep the request's bytes with it
            del raw
            await self._abort(context, failure)
        context.set_trailing_metadata(tuple(zip(TIMING_NAMES, timing_values(result), strict=True)))
        return response

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """Each request answered on the stream as soon as it completes (not in request
        order), with its id; a refused or failed request answers ``error_message`` with its
        id and the stream goes on, as Triton does. At most ``STREAM_INFLIGHT`` requests of
        one stream are unanswered at once: past that the stream stops reading, and HTTP/2
        flow control holds the client back."""
        request_protocol.set("grpc")  # copied into every task made below
        loop = asyncio.get_running_loop()
        answers: asyncio.Queue[Any] = asyncio.Queue()
        room = asyncio.Semaphore(STREAM_INFLIGHT)
        tasks: set[asyncio.Task[Any]] = set()
        reading = True

        def answered(task: asyncio.Task[Any]) -> None:
            tasks.discard(task)
            if not task.cancelled():
                answers.put_nowait(task.result())  # a decoupled request's end: _STREAMED
            if not reading and not tasks:
                answers.put_nowait(None)

        async def read() -> None:
            nonlocal reading
            try:
                async for request in request_iterator:
                    await room.acquire()
                    task = loop.create_task(self._stream_answer(request, answers.put_nowait))
                    tasks.add(task)
                    task.add_done_callback(answered)
            finally:
                reading = False
                if not tasks:
                    answers.put_nowait(None)

        reader = loop.create_task(read())
        self._streams.add(answers)
        try:
            while True:
                answer = await answers.get()
                if answer is None:
                    return
                if answer is _CLOSING:  # the server stops: take no more, finish what is in flight
                    reader.cancel()
                    continue
                if isinstance(answer, _Partial):  # one of a decoupled request's responses
                    yield answer.message
                    continue
                if answer is not _STREAMED:
                    yield answer
                room.release()
        finally:
            self._streams.discard(answers)
            reader.cancel()
            for task in list(tasks):  # the client went away: its queued requests are dropped
                task.cancel()

    def close_streams(self) -> None:
        """Server stop: every open stream stops reading, answers what it accepted, ends."""
        for answers in self._streams:
            answers.put_nowait(_CLOSING)

    async def _stream_answer(self, raw: bytes, put: Callable[[Any], None]) -> Any:
        request_id = ""
        decoupled: DecoupledAnswers | None = None
        try:
            request_id = _peek_id(raw)
            request, runtime, reserved = await self._receive(raw)
            decoupled = DecoupledAnswers(self, request, put)
            try:
                response, _ = await self._infer(request, runtime, decoupled.decode)
                if decoupled.stream is not None:  # answered through the stream, final flag last
                    await decoupled.stream.finished.wait()
                    return _STREAMED
                if decoupled.tokens is not None:  # a language model's tokens went out one by one
                    return decoupled.tokens.end(response)
            except asyncio.CancelledError:  # the client went away: the model's sender says so
                if decoupled.stream is not None:
                    decoupled.stream.cancel()
                raise
            finally:
                self.body_budget.release(reserved)
        except Failure as failure:
            if decoupled is not None and decoupled.tokens is not None and decoupled.tokens.final_sent:
                return _STREAMED  # answered meanwhile (a deadline) after its final token went out
            return service_pb2.ModelStreamInferResponse(
                error_message=str(failure), infer_response=service_pb2.ModelInferResponse(id=request_id)
            )
        return service_pb2.ModelStreamInferResponse(infer_response=response)

    # ------------------------------------------------------------------ receiving a request
    async def _receive(self, raw: bytes) -> tuple[Any, ModelRuntime, int]:
        """Refuse from the wire header alone (``server.grpc.wire``) what cannot be served:
        an unknown or unavailable model, unknown inputs, a wrong datatype or shape, a message
        whose decoding would cost more than the whole body budget. Then parse it, holding
        its worst-case decoding cost in the body budget; returns the message, the runtime
        selected for it (admitted as is: looked up once) and that reservation, which the
        caller releases once the request is answered."""
        try:
            peek = peek_request(raw)
        except WireError as exc:
            raise Failure(S.INVALID_ARGUMENT, f"malformed ModelInferRequest: {exc}") from None
        try:
            runtime = self._select(peek.model_name, peek.model_version or None)
        except ModelUnavailable as refused:  # failed to load or unloaded: Triton answers UNAVAILABLE
            raise Failure(S.UNAVAILABLE, str(refused)) from None
        except Refused as refused:
            raise Failure.of(refused) from None
        engine = runtime.engine
        cost = peek.decode_cost(len(raw))
        try:
            if engine is not None:
                _check_header(peek, engine.inputs, runtime.request_max_batch)
            if cost > self.body_budget.limit:
                raise BadRequest(
                    f"decoding this request could take {cost >> 20} MiB, more than the server "
                    f"decodes at once ({self.body_budget.limit >> 20} MiB, max_inflight_body_bytes); "
                    "send tensors as raw_input_contents",
                    Status.TOO_LARGE,
                )
        except BadRequest as exc:
            runtime.metrics.outcome["bad_request"].inc()
            raise Failure(GRPC_CODES[exc.status], str(exc)) from None
        if not self.body_budget.try_reserve(cost):
            runtime.metrics.outcome["queue_full"].inc()
            raise Failure(S.UNAVAILABLE, str(BudgetExceeded()), retry=True)
        try:
            if len(raw) > OFFLOAD_DECODE_BYTES:
                message = await asyncio.to_thread(service_pb2.ModelInferRequest.FromString, raw)
            else:
                message = service_pb2.ModelInferRequest.FromString(raw)
        except Exception as exc:  # protobuf's DecodeError: what the peek could not see
            self.body_budget.release(cost)
            raise Failure(S.INVALID_ARGUMENT, f"malformed ModelInferRequest: {exc}") from None
        return message, runtime, cost

    def _select(self, name: str, version: str | None) -> ModelRuntime:
        """The runtime that serves a request (``admission.select``; a front-end process
        answers with its view of the engine core's model)."""
        return select(self.models, name, version)

    async def _read(self, runtime: ModelRuntime, message: Any) -> tuple[Any, int, int]:
        """The decoder's reader: the parsed message and its tensors' size. Nothing more is
        reserved: ``_receive`` holds the message's worst-case decoding cost until the answer."""
        return message, 0, payload_bytes(message)

    async def _infer(self, message: Any, runtime: ModelRuntime, decode: Any = None) -> tuple[Any, Any]:
        """The admission path with the protobuf decoder, for the runtime ``_receive``
        selected; Failure for every refusal."""
        name = message.model_name
        try:
            done = await admit(self.models, name, message.model_version or None,
                               decode or self._decode, message, runtime=runtime)  # fmt: skip
            runtime, engine = done.runtime, done.engine
            assert engine is not None  # the inference decoder gives the engine it decoded for
            if not done.result.outputs and is_decoupled(runtime.config):
                return None, done.result  # a decoupled request: its responses went to its stream
            response = build_response(name, runtime.version, done.request, done.result.outputs,
                                      engine.outputs, self.shm, labels=runtime.class_labels)  # fmt: skip
        except ModelUnavailable as refused:
            # the model failed to load or was unloaded: not the request's fault, Triton
            # answers UNAVAILABLE
            raise Failure(S.UNAVAILABLE, str(refused)) from None
        except Refused as refused:
            raise Failure.of(refused) from None
        except ExtensionError as exc:  # an output region too small, or unregistered meanwhile
            raise Failure(GRPC_CODES[exc.status], str(exc)) from None
        except Exception as exc:  # a bug, not a refusal: the request fails alone
            log.exception("gRPC inference for %r failed", name)
            raise Failure(S.INTERNAL, f"internal error: {type(exc).__name__}") from None
        return response, done.result

    # ------------------------------------------------------------------ shared memory, trace, logging
    # Triton's extensions (server.extensions.shared_memory, server.extensions.trace_logging); refusals carry
    # Triton's messages and codes.
    async def SystemSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        regions = await self._extension(context, self.shm.status, "system", request.name)
        response = service_pb2.SystemSharedMemoryStatusResponse()
        for doc in regions:
            response.regions[doc["name"]].CopyFrom(
                service_pb2.SystemSharedMemoryStatusResponse.RegionStatus(**doc)
            )
        return response

    async def SystemSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._extension(context, self.shm.register_system, request.name, request.key, request.offset,
                              request.byte_size)  # fmt: skip
        return service_pb2.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        if request.name:
            await self._extension(context, self.shm.unregister, request.name, "system")
        else:
            await self._extension(context, self.shm.unregister_all, "system")
        return service_pb2.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(self, request: Any, context: Any) -> Any:
        regions = await self._extension(context, self.shm.status, "cuda", request.name)
        response = service_pb2.CudaSharedMemoryStatusResponse()
        for doc in regions:
            response.regions[doc["name"]].CopyFrom(
                service_pb2.CudaSharedMemoryStatusResponse.RegionStatus(**doc)
            )
        return response

    async def CudaSharedMemoryRegister(self, request: Any, context: Any) -> Any:
        await self._extension(context, self.shm.register_cuda, request.name, request.raw_handle,
                              request.device_id, request.byte_size)  # fmt: skip
        return service_pb2.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(self, request: Any, context: Any) -> Any:
        if request.name:
            await self._extension(context, self.shm.unregister, request.name, "cuda")
        else:
            await self._extension(context, self.shm.unregister_all, "cuda")
        return service_pb2.CudaSharedMemoryUnregisterResponse()

    async def TraceSetting(self, request: Any, context: Any) -> Any:
        def call() -> dict[str, Any]:
            if request.model_name:
                check_model_ready(self.models, request.model_name)
            if not request.settings:
                return self.trace.get(request.model_name or None)
            changes: dict[str, Any] = {}
            for key, setting in request.settings.items():
                values = list(setting.value)
                if key == "trace_level" or not values:
                    changes[key] = values or None
                elif len(values) == 1:
                    changes[key] = values[0]
                else:
                    raise ExtensionError(f"expect only 1 value for '{key}'")
            return self.trace.update(request.model_name or None, changes)

        doc = await self._extension(context, call)
        response = service_pb2.TraceSettingResponse()
        for key, value in doc.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    async def LogSettings(self, request: Any, context: Any) -> Any:
        changes = {}
        for key, setting in request.settings.items():
            choice = setting.WhichOneof("parameter_choice")
            changes[key] = None if choice is None else getattr(setting, choice)
        doc = await self._extension(context, self.log.update, changes)
        response = service_pb2.LogSettingsResponse()
        for key, value in doc.items():
            field = (
                "bool_param"
                if isinstance(value, bool)
                else "uint32_param"
                if isinstance(value, int)
                else "string_param"
            )
            setattr(response.settings[key], field, value)
        return response

    async def _extension(self, context: Any, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except ExtensionError as exc:
            await self._abort(context, Failure(GRPC_CODES[exc.status], str(exc)))

    # ------------------------------------------------------------------ helpers
    async def _serving(self, name: str, version: str, context: Any) -> ModelRuntime:
        try:
            return serving_runtime(self.models, name, version or None)
        except Refused as refused:
            await self._abort(context, Failure.of(refused))
            raise  # unreachable: abort raises

    async def _abort(self, context: Any, failure: Failure) -> None:
        """End the call with ``failure`` (raises, as grpc.aio's abort does)."""
        metadata = self.retry_metadata if failure.retry else ()
        await context.abort(failure.code, str(failure), trailing_metadata=metadata)


def grpc_override(name: str, parameters: Any) -> LoadOverride | None:
    """The override a gRPC load's parameters carry: ``config`` as string_param, each
    ``file:<path>`` as bytes_param (tritonclient.grpc's load_model(config=, files=))."""
    config = None
    if "config" in parameters:
        param = parameters["config"]
        if param.WhichOneof("parameter_choice") != "string_param":
            raise OverrideError("parameter 'config' must be a string_param holding JSON")
        config = param.string_param
    files = {}
    for key, param in parameters.items():
        if key.startswith(FILE_PREFIX):
            if param.WhichOneof("parameter_choice") != "bytes_param":
                raise OverrideError(f"parameter {key!r} must be a bytes_param holding the file")
            files[key] = param.bytes_param
    return parse_override(name, config, files)


_CLOSING = object()  # put on a stream's answer queue when the server stops


class _Partial:
    """One response of a decoupled request, put on its stream's answer queue."""

    __slots__ = ("message",)

    def __init__(self, message: Any) -> None:
        self.message = message


_STREAMED = object()  # a decoupled request's task ended (its responses went out as _Partial)


class DecoupledAnswers:
    """A streamed request to a decoupled model: its decoder attaches a ``ResponseStream``
    whose responses go to the stream as ModelStreamInferResponse messages (Triton's
    ``triton_final_response`` parameter when the client enabled empty final responses)."""

    def __init__(self, service: InferenceService, message: Any, put: Callable[[Any], None]) -> None:
        self.service = service
        self.message = message
        self.put = put
        self.stream: ResponseStream | None = None
        self.tokens: TokenAnswers | None = None  # a language model's request, streamed
        param = message.parameters.get("triton_enable_empty_final_response")
        self.empty_final = bool(param is not None and param.bool_param)

    async def decode(self, runtime: ModelRuntime, message: Any) -> tuple[Any, Any]:
        request, engine = await self.service._decode(runtime, message)
        loop = asyncio.get_running_loop()
        if is_decoupled(runtime.config):
            self.stream = ResponseStream(loop, partial(self.emit, runtime, request, engine))
            request.response_sink = self.stream.sink
            request.response_cancelled = self.stream.is_cancelled
        elif getattr(engine, "streams_tokens", False):  # a language model: one response per token
            tokens = TokenAnswers(self.message.model_name, runtime.version, request, engine, self)
            if stream_wanted(request.parameters, request.inputs):
                request.token_sink = token_sink(loop, tokens.emit)
            self.tokens = tokens
        return request, engine

    def emit(
        self, runtime: ModelRuntime, request: Any, engine: Any, outputs: Any, error: Any, final: bool
    ) -> None:
        """On the loop: one response (or the final flag alone) as a stream message."""
        name, version = self.message.model_name, runtime.version
        head = {"id": request.id or "", "model_name": name, "model_version": version}
        messages = []
        if error is not None:
            empty = service_pb2.ModelInferResponse(**head)
            messages.append(
                service_pb2.ModelStreamInferResponse(error_message=str(error), infer_response=empty)
            )
        elif outputs is not None:
            response = build_response(name, version, request, outputs, engine.outputs, self.service.shm)
            messages.append(service_pb2.ModelStreamInferResponse(infer_response=response))
        if self.empty_final:  # Triton marks each response; the final flag alone is an empty one
            for message in messages:
                message.infer_response.parameters["triton_final_response"].bool_param = False
            if final:
                last = service_pb2.ModelInferResponse(**head)
                last.parameters["triton_final_response"].bool_param = True
                messages.append(service_pb2.ModelStreamInferResponse(infer_response=last))
        for message in messages:
            self.put(_Partial(message))


class TokenAnswers:
    """A streamed request to a language model: each token as its own ModelStreamInferResponse
    (``text_output`` the new text, the request's id), the one that ends the generation
    flagged ``triton_final_response`` (Triton's vLLM and TensorRT-LLM backends send the
    last piece with the final flag; Triton's stream handler marks every response). With
    ``stream: false`` the request's one answer is the final response."""

    def __init__(self, name: str, version: str, request: Any, engine: Any, answers: DecoupledAnswers) -> None:
        self.name, self.version = name, version
        self.request, self.engine = request, engine
        self.answers = answers
        self.sent = 0
        self.final_sent = False

    def emit(self, outputs: dict[str, Any], final: bool) -> None:
        """On the loop, in the order generated: one token's response."""
        response = build_response(self.name, self.version, self.request, outputs, self.engine.outputs,
                                  self.answers.service.shm)  # fmt: skip
        response.parameters["triton_final_response"].bool_param = final
        self.sent += 1
        self.final_sent = self.final_sent or final
        self.answers.put(_Partial(service_pb2.ModelStreamInferResponse(infer_response=response)))

    def end(self, response: Any) -> Any:
        """The request's answer arrived (every token's callback ran before it, on the loop):
        nothing more when the final token went out; else the whole answer, flagged final
        (``stream: false``, or a response-cache hit), or, when some tokens went out but
        none was the last, an empty final response."""
        if self.final_sent:
            return _STREAMED
        if self.sent:
            response = service_pb2.ModelInferResponse(id=self.request.id or "", model_name=self.name,
                                                      model_version=self.version)  # fmt: skip
        response.parameters["triton_final_response"].bool_param = True
        return service_pb2.ModelStreamInferResponse(infer_response=response)


def _peek_id(raw: bytes) -> str:
    try:
        return peek_request(raw).id
    except WireError:
        return ""


def _check_header(peek: RequestPeek, specs: Any, max_batch_size: int) -> None:
    """The checks of ``parse_grpc_request`` that need no tensor data, with its messages."""
    by_name = {s.name: s for s in specs}
    for tensor in peek.inputs:
        if tensor.name not in by_name:
            raise BadRequest(f"unknown input {tensor.name!r}; expected {sorted(by_name)}")
        check_tensor_header(tensor.shape, tensor.datatype, by_name[tensor.name], max_batch_size)


SERVICE = "inference.GRPCInferenceService"


def add_service(service: InferenceService, server: Any) -> None:
    """Register every RPC as Triton's generated code does, except that ModelInfer and
    ModelStreamInfer take their requests as bytes: ``_receive`` parses them only after
    checking what they ask for (a 50 MiB message of typed BYTES to an unknown model was
    parsed into ~0.5 GB of protobuf objects before its NOT_FOUND)."""

    class Capture:
        handlers: dict[str, Any] = {}

        def add_generic_rpc_handlers(self, handlers: Any) -> None:
            pass

        def add_registered_method_handlers(self, name: str, handlers: dict[str, Any]) -> None:
            self.handlers = dict(handlers)

    capture = Capture()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, capture)
    handlers = capture.handlers
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        service.ModelInfer, response_serializer=service_pb2.ModelInferResponse.SerializeToString
    )
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        service.ModelStreamInfer, response_serializer=service_pb2.ModelStreamInferResponse.SerializeToString
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


class GrpcFrontEnd:
    """The grpc.aio server of one app: bound early (a taken port fails start-up at once),
    started once the models are loaded, stopped in the app's lifespan."""

    def __init__(
        self,
        models: ModelSet,
        settings: Settings,
        body_budget: BodyBudget,
        restrictions: list[Restriction],
        shm: SharedMemoryRegistry | None = None,
        trace: TraceSettings | None = None,
        log: LogSettings | None = None,
        address: str | None = None,
    ) -> None:
        """``address``: where to listen instead of the settings' host and port (e.g. the
        engine core's ``unix:`` socket behind front-end processes)."""
        self.settings = settings
        self.service = InferenceService(models, settings, body_budget, shm, trace, log)
        self.restrictions = restrictions
        host = settings.grpc_host or settings.host
        if ":" in host and not host.startswith("["):  # an IPv6 address, e.g. "::"
            host = f"[{host}]"
        self.address = address or f"{host}:{settings.grpc_port}"
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None

    def bind(self) -> int:
        """Create the server on the running loop and bind its port (RuntimeError if taken)."""
        s = self.settings
        interceptors = []
        if self.restrictions or s.api_token:
            interceptors.append(GrpcAccessControl(self.restrictions, s.api_token))
        options = [
            ("grpc.max_receive_message_length", s.max_body_bytes),  # issue 9's body limit
            ("grpc.max_send_message_length", -1),
            ("grpc.max_metadata_size", s.max_header_bytes),
            ("grpc.so_reuseport", 0),  # a taken port is an error, not a silently shared one
        ]
        server = grpc.aio.server(interceptors=interceptors, options=options)
        add_service(self.service, server)
        port = server.add_insecure_port(self.address)
        if not port:
            raise RuntimeError(f"gRPC could not bind {self.address}")
        self._server, self.port = server, port
        return port

    async def start(self) -> None:
        assert self._server is not None, "bind() first"
        await self._server.start()
        log.info("KServe v2 gRPC on %s", self.address.rsplit(":", 1)[0] + f":{self.port}")

    async def stop(self, grace_s: float) -> None:
        """Refuse new calls, let calls in flight (and open streams' accepted requests) be
        answered within ``grace_s``, then cancel what is left."""
        if self._server is None:
            return
        self.service.close_streams()
        await self._server.stop(grace_s)
        self._server = None


__all__ = ["GRPC_CODES", "Failure", "GrpcFrontEnd", "InferenceService"]
