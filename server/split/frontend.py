"""A front-end process: HTTP (and gRPC) on the public ports, the engine core behind it.

Inference on a model the core describes (fixed tensors, no shared memory or classification
asked) is read, parsed, validated and encoded here, with the same code as a one-process
server (``server.http.routes.inference.infer_routes``), and crosses to the core as slab
offsets. Everything else is forwarded whole to the core's own HTTP server
(``server.split.http_proxy``) and gRPC server (``server.split.grpc_proxy``). Liveness is
this process's; readiness is the core's, and false while the core is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp
from wattserve.batchers.types import RequestError
from wattserve.server.core.admission import Admitted, Refused, admit
from wattserve.server.core.decode import BodyBudget, InferenceDecoder
from wattserve.server.http.codec import InferBody, parse_infer_body
from wattserve.server.http.fast_path import InferenceFastPath
from wattserve.server.http.middleware import internal_error
from wattserve.server.http.routes.body import check_content_type, inference_headers, read_reserved_body
from wattserve.server.http.routes.common import json_response, watching_submit
from wattserve.server.http.routes.inference import infer_routes
from wattserve.server.security import AccessControl, parse_restricted_api
from wattserve.server.settings import Settings
from wattserve.server.split.core_client import CoreClient, RemoteRuntime
from wattserve.server.split.http_proxy import CoreHttp

log = logging.getLogger("wattserve.frontend")

# Asked of a request's JSON before it is handed to the core whole: these need the core's
# state (registered shared-memory regions, class label files).
CORE_ONLY_KEYS = (b'"shared_memory_region"', b'"classification"')


class ToCore(Exception):
    """This request is answered by the core whole (its body goes along when already read)."""

    def __init__(self, body: bytes | None = None) -> None:
        super().__init__("forwarded")
        self.body = body


class FrontEndRuntimes:
    """One ``RemoteRuntime`` per model the core described (rebuilt when the core reloads it)."""

    def __init__(self, client: CoreClient) -> None:
        self.client = client
        self._by_token: dict[int, RemoteRuntime] = {}
        self._last: dict[tuple[str, str | None], RemoteRuntime] = {}

    async def get(self, name: str, version: str | None) -> RemoteRuntime | None:
        info = await self.client.describe(name, version)
        if info is None:
            return None
        runtime = self._by_token.get(info.token)
        if runtime is None:
            runtime = self._by_token[info.token] = RemoteRuntime(self.client, info, version)
        self._last[(name, version)] = runtime
        return runtime

    def cached(self, name: str, version: str | None) -> RemoteRuntime:
        """The runtime ``get`` just gave for this name and version (the gRPC service's
        synchronous lookup, after its handler awaited ``get``)."""
        return self._last[(name, version)]


def frontend_app(
    settings: Settings,
    runtimes: FrontEndRuntimes,
    core_http: CoreHttp,
    budget: BodyBudget,
    services: Callable[[], contextlib.AbstractAsyncContextManager[None]] | None = None,
) -> Starlette:
    """The front end's ASGI app: the infer fast path, local liveness, the rest forwarded.
    ``budget``: the body bytes being read at once, shared with the gRPC port; ``services``:
    what else lives as long as the app (the gRPC port)."""
    client = runtimes.client
    max_body_bytes = settings.max_body_bytes

    async def read(runtime: Any, request: Request) -> tuple[InferBody, int, int]:
        content_type, declared, binary_length = inference_headers(request.scope)
        check_content_type(content_type)
        body, held = await read_reserved_body(request, declared, max_body_bytes, budget)
        json_part = body[: int(binary_length)] if binary_length and binary_length.isdigit() else body
        if any(key in json_part for key in CORE_ONLY_KEYS):
            budget.release(held)
            raise ToCore(body)
        return (body, binary_length), held, len(body)

    decode = InferenceDecoder(read, parse_infer_body, budget, None)

    async def admit_request(request: Request, name: str, version: str | None) -> Admitted:
        try:
            runtime = await runtimes.get(name, version)
        except RequestError as exc:  # the core is away
            raise Refused(str(exc), exc.status, exc.retry_after, body_unread=True) from None
        if runtime is None:
            raise ToCore()
        return await admit(None, name, version, decode, request, watching_submit, runtime=runtime)  # type: ignore[arg-type]

    [infer_path, infer_version_path] = infer_routes(admit_request, settings.retry_after_s)

    def forwarding(route: Route) -> Route:
        answer = route.endpoint

        async def infer(request: Request) -> Response:
            try:
                return await answer(request)
            except ToCore as forward:
                return await core_http.forward(request, forward.body)

        return Route(route.path, infer, methods=["POST"])

    async def live(request: Request) -> Response:
        return json_response({"live": True})

    async def ready(request: Request) -> Response:
        if client.draining or not client.connected.is_set():
            return json_response({"ready": False}, 503)
        return await core_http.forward(request)

    async def forward(request: Request) -> Response:
        return await core_http.forward(request)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        client.start()  # already started by a front-end process, which waits for the core first
        try:
            if services is None:
                yield
            else:
                async with services():
                    yield
        finally:
            await client.close()
            await core_http.close()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    fast_routes = [forwarding(infer_path), forwarding(infer_version_path)]
    routes = [
        *fast_routes,
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route("/{path:path}", forward, methods=methods),
    ]
    app = FrontEndApp(routes=routes, lifespan=lifespan, exception_handlers={Exception: internal_error})
    app.fast_routes = fast_routes
    restrictions = parse_restricted_api(settings.restricted_api)
    if restrictions or settings.api_token:
        app.add_middleware(AccessControl, restrictions=restrictions, api_token=settings.api_token)
    return app


class FrontEndApp(Starlette):
    """Starlette, with the infer routes past the middleware stack when no middleware of the
    app's own must see every request (``server.http.fast_path``, as the one-process app)."""

    fast_routes: list[Route] = []

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        if not self.fast_routes or self.user_middleware:
            return stack
        return InferenceFastPath(stack, self.fast_routes)


class FrontEndDrain:
    """SIGTERM in a front end: not ready at once, then wait for every request in flight."""

    def __init__(self, client: CoreClient) -> None:
        self.client = client

    async def drain(self, grace_s: float = 0.0) -> None:
        if grace_s > 0:
            await asyncio.sleep(grace_s)
        self.client.draining = True
        await self.client.idle()
