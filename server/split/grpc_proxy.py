"""A front end's gRPC port: every KServe v2 RPC relayed, as bytes, to the core's gRPC server.

The messages are not parsed here (no protobuf objects, no copy beyond the relay's own):
the core's gRPC front end answers them as a single-process server would, streams included,
with its status codes and trailing metadata passed back unchanged. The public port is
shared by every front end with SO_REUSEPORT. gRPC inference is relayed, not decoded in the
front end: its per-request work stays in the core (docs/architecture.md says what that costs).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from wattserve.server.grpc.service import SERVICE

log = logging.getLogger("wattserve.frontend")

STREAMING = frozenset({"ModelStreamInfer"})
# metadata the transport sets itself
RESERVED = frozenset({"user-agent", "grpc-timeout", "content-type", "te", "grpc-accept-encoding",
                      "grpc-encoding", "accept-encoding"})  # fmt: skip


def _forwarded(context: grpc.aio.ServicerContext) -> tuple[tuple[str, Any], ...]:
    return tuple((k, v) for k, v in (context.invocation_metadata() or ()) if k not in RESERVED)


def _timeout(context: grpc.aio.ServicerContext) -> float | None:
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e8 else None


class RelayHandler(grpc.GenericRpcHandler):
    """Any method of the inference service, relayed to ``channel`` (the core's socket)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self._calls: dict[str, Any] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method = details.method  # "/inference.GRPCInferenceService/ModelInfer"
        _, service, name = method.split("/", 2) if method.count("/") == 2 else ("", "", "")
        if service != SERVICE:
            return None
        if name in STREAMING:
            return grpc.stream_stream_rpc_method_handler(self._stream(method))
        return grpc.unary_unary_rpc_method_handler(self._unary(method))

    def _unary(self, method: str) -> Any:
        call = self.channel.unary_unary(method)

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
        call = self.channel.stream_stream(method)

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
        self, address: str, core_address: str, max_message_bytes: int, max_metadata_bytes: int
    ) -> None:
        self.address = address
        self.core_address = core_address
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
        server.add_generic_rpc_handlers((RelayHandler(self._channel),))
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
