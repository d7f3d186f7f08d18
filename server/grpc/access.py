"""Who may call which gRPC method: the HTTP side's restricted-API groups and bearer token
(``server.security``), read from gRPC metadata the way Triton reads them.

Triton's gRPC restricted protocols expect the header with the ``triton-grpc-protocol-``
prefix and answer UNAVAILABLE ("This protocol is restricted, expecting header ...") without
it; the bare header name is accepted too, so one client configuration serves both
protocols. The bearer token guards inference (``authorization: Bearer <token>``,
UNAUTHENTICATED otherwise), as on HTTP. Installed only when configured.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from wattserve.server.security import Restriction

TRITON_PREFIX = b"triton-grpc-protocol-"

API_OF_METHOD = {  # Triton's restricted-API groups, by gRPC method
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "ModelConfig": "model-config",
    "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}


class GrpcAccessControl(grpc.aio.ServerInterceptor):
    def __init__(self, restrictions: list[Restriction], api_token: str | None) -> None:
        self.restrictions = restrictions
        self.token = api_token.encode() if api_token else None

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(details)
        api = API_OF_METHOD.get(details.method.rsplit("/", 1)[-1])
        if handler is None or api is None:
            return handler
        refusal = self.refusal(api, details.invocation_metadata or ())
        return handler if refusal is None else _refusing(handler, *refusal)

    def refusal(self, api: str, metadata: Any) -> tuple[grpc.StatusCode, str] | None:
        headers = {k.encode() if isinstance(k, str) else k: v for k, v in metadata}
        for r in self.restrictions:
            if api in r.apis:
                got = headers.get(TRITON_PREFIX + r.header, headers.get(r.header))
                if isinstance(got, str):
                    got = got.encode()
                if got is None or not hmac.compare_digest(got, r.value):
                    expected = (TRITON_PREFIX + r.header).decode()
                    return (
                        grpc.StatusCode.UNAVAILABLE,
                        f"This protocol is restricted, expecting header '{expected}'",
                    )
        if self.token is not None and api == "inference":
            auth = headers.get(b"authorization", "")
            auth = auth.encode() if isinstance(auth, str) else auth
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.token):
                return grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token"
        return None


def _refusing(handler: Any, code: grpc.StatusCode, message: str) -> Any:
    """A handler of the same kind as ``handler`` that ends the call with ``code``."""

    async def refuse(_request: Any, context: Any) -> None:
        await context.abort(code, message)

    serializers = {"request_deserializer": handler.request_deserializer,
                   "response_serializer": handler.response_serializer}  # fmt: skip
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **serializers)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **serializers)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **serializers)
    return grpc.unary_unary_rpc_method_handler(refuse, **serializers)
