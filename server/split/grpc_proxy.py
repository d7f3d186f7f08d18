"""A front end's gRPC port (shared by every front end with SO_REUSEPORT).

``ModelInfer`` on a model the core described is answered here with the one-process gRPC
service's own code (``server.grpc.service.InferenceService``: the wire peek, parse,
validation and encoding), its runtime this front end's ``RemoteRuntime``. Every other RPC
(and inference that needs the core's state: shared memory, classification) is relayed as
bytes to the core's gRPC server, which answers as a single-process server would, streams
included, with its status codes and trailing metadata passed back unchanged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from wattserve.batchers.types import RequestError
from wattserve.server.core.decode import BodyBudget
from wattserve.server.grpc.service import SERVICE, InferenceService
from wattserve.server.grpc.wire import WireError, peek_request
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.settings import Settings
from wattserve.server.split.frontend import FrontEndRuntimes

log = logging.getLogger("wattserve.frontend")

STREAMING = frozenset({"ModelStreamInfer"})
# Parameter names (protobuf map keys, as bytes on the wire) of inference that needs the
# core's state; tensor bytes that happen to spell one only send that request the long way.
CORE_ONLY_KEYS = (b"shared_memory_region", b"classification")
# metadata the transport sets itself
RESERVED = frozenset({"user-agent", "grpc-timeout", "content-type", "te", "grpc-accept-encoding",
                      "grpc-encoding", "accept-encoding"})  # fmt: skip


def _forwarded(context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...]:
    return tuple((k, v) for k, v in (context.invocation_metadata() or ()) if k not in RESERVED)


def _timeout(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e8 else None


class FrontEndInference(InferenceService):
    """The one-process gRPC inference over the core's models as this front end sees them."""

    def __init__(self, runtimes: FrontEndRuntimes, settings: Settings, budget: BodyBudget) -> None:
        super().__init__(None, settings, budget)  # type: ignore[arg-type]  # no ModelSet here
        self.runtimes = runtimes

    def _select(self, name: str, version: str | None) -> ModelRuntime:
        return self.runtimes.cached(name, version)  # type: ignore[return-value]


class RelayHandler(grpc.GenericRpcHandler):
    """Any method of the inference service, relayed to ``channel`` (the core's socket);
    ``ModelInfer`` answered by ``inference`` where it can be."""

    def __init__(self, channel: grpc.aio.Channel, inference: FrontEndInference | None = None) -> None:
        self.channel = channel
        self.inference = inference
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method  # "/inference.GRPCInferenceService/ModelInfer"
        handler = self._handlers.get(method)
        if handler is not None:
            return handler
        _, service, name = method.split("/", 2) if method.count("/") == 2 else ("", "", "")
        if service != SERVICE:
            return None
        if name in STREAMING:
            handler = grpc.stream_stream_rpc_method_handler(self._stream(method))
        elif name == "ModelInfer" and self.inference is not None:
            handler = grpc.unary_unary_rpc_method_handler(self._infer(method, self.inference))
        else:
            handler = grpc.unary_unary_rpc_method_handler(self._unary(method))
        self._handlers[method] = handler
        return handler

    def _infer(self, method: str, inference: FrontEndInference) -> Any:
        relay = self._unary(method)

        async def infer(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if any(key in raw for key in CORE_ONLY_KEYS):
                return await relay(raw, context)
            try:
                peek = peek_request(raw)
                runtime = await inference.runtimes.get(peek.model_name, peek.model_version or None)
            except WireError:  # the core answers it, in its words
                return await relay(raw, context)
            except RequestError as exc:  # the core is away
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc),
                                    trailing_metadata=inference.retry_metadata)  # fmt: skip
                raise  # unreachable: abort raises
            if runtime is None:
                return await relay(raw, context)
            response = await inference.ModelInfer(raw, context)
            return response.SerializeToString()

        return infer

    def _unary(self, method: str) -> Any:
        call: Any = self.channel.unary_unary(method)

        async def relay(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            upstream = call(request, metadata=_forwarded(context), timeout=_timeout(context))
            try:
                answer = await upstream
            except grpc.aio.AioRpcError as exc:
                await _pass_on(context, exc)
                raise  # unreachable: abort raises
            context.set_trailing_metadata(await upstream.trailing_metadata() or ())
            return answer

        return relay

    def _stream(self, method: str) -> Any:
        call: Any = self.channel.stream_stream(method)

        async def relay(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
        ) -> AsyncIterator[bytes]:
            upstream = call(requests, metadata=_forwarded(context), timeout=_timeout(context))
            try:
                async for answer in upstream:
                    yield answer
            except grpc.aio.AioRpcError as exc:
                await _pass_on(context, exc)
            finally:
                upstream.cancel()  # the client left (or the stream ended): end the core's side too

        return relay


async def _pass_on(context: grpc.aio.ServicerContext, exc: grpc.aio.AioRpcError) -> None:
    """The core's status, details and trailers, as the client's; UNAVAILABLE while it is away."""
    trailers = exc.trailing_metadata() or ()
    await context.abort(exc.code(), exc.details() or "", trailing_metadata=tuple(trailers))


class GrpcRelay:
    """The front end's grpc.aio server on the shared public port."""

    def __init__(
        self,
        address: str,
        core_address: str,
        max_message_bytes: int,
        max_metadata_bytes: int,
        inference: FrontEndInference | None = None,
    ) -> None:
        self.address = address
        self.core_address = core_address
        self.inference = inference
        self.options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", -1),
            ("grpc.max_metadata_size", max_metadata_bytes),
            ("grpc.so_reuseport", 1),  # every front end listens on the same port
        ]
        self._server: grpc.aio.Server | None = None
        self._channel: grpc.aio.Channel | None = None

    async def start(self) -> int:
        self._channel = grpc.aio.insecure_channel(
            self.core_address,
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
        )
        server = grpc.aio.server(options=self.options)
        server.add_generic_rpc_handlers((RelayHandler(self._channel, self.inference),))
        port = server.add_insecure_port(self.address)
        if not port:
            raise RuntimeError(f"gRPC could not bind {self.address}")
        await server.start()
        self._server = server
        return port

    async def stop(self, grace_s: float) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
        if self._channel is not None:
            with contextlib.suppress(Exception):
                await self._channel.close()
