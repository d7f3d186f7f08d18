"""The inference routes without the framework's middleware stack.

Every request to a FastAPI app passes seven ASGI layers before its route (server errors,
FastAPI's exception telemetry and body limit, exception handlers, the dependency exit stack,
the router's table walk) and the route's own exception wrapper. The inference endpoint uses
none of them: it reads its body within its own limits, answers every refusal itself and
raises nothing on purpose. Profiled on the identity model at 16 connections, the layers
between ``FastAPI.__call__`` and the endpoint were ~16% of the server's samples.

So POST .../infer goes straight to its endpoint when the app has no middleware of its own
(access control is one: with it configured every request takes the full stack). An
unexpected exception still gets the app's JSON 500 (``middleware.internal_error``) and is
logged, as the full stack would.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from time import monotonic

from fastapi import FastAPI
from starlette.requests import Request
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send
from wattserve.server.http.middleware import internal_error

log = logging.getLogger("wattserve.server")

TELEMETRY_RECHECK_S = 1.0  # how soon an OpenTelemetry provider set after start is noticed


class InferenceFastPath:
    """ASGI: a POST that one of ``routes`` matches fully goes to its endpoint; everything
    else (and everything while the app is starting or stopping) to ``app``."""

    def __init__(self, app: ASGIApp, routes: Sequence[Route]) -> None:
        self.app = app
        self.routes = tuple(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            for route in self.routes:
                match, child = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child)
                    await self._answer(route, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    @staticmethod
    async def _answer(route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response = await route.endpoint(request)
        except Exception as exc:
            log.exception("inference request failed unexpectedly")
            response = await internal_error(request, exc)
        await response(scope, receive, send)


class WattserveApp(FastAPI):
    """FastAPI, with ``fast_routes`` served by ``InferenceFastPath`` when no middleware of
    the app's own must see every request."""

    fast_routes: Sequence[Route] = ()
    _telemetry_on = True  # FastAPI's native OpenTelemetry has a configured provider (cached)
    _telemetry_checked_at = -TELEMETRY_RECHECK_S

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        if not self.fast_routes or self.user_middleware:
            return stack
        return InferenceFastPath(stack, self.fast_routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """HTTP straight into the fast path while OpenTelemetry is not configured.

        ``FastAPI.__call__`` asks on every request whether an OpenTelemetry provider is
        configured (``NativeTelemetry.enabled``: three provider lookups, ~8 us, ~4% of the
        server's samples on the identity model). A provider, once set, cannot be unset, so
        the answer is cached here and asked again once a second while it is no; when it is
        yes, every request takes FastAPI's own path and gets its span."""
        stack = self.middleware_stack
        if scope["type"] == "http" and isinstance(stack, InferenceFastPath) and not self._telemetry_enabled():
            if self.root_path:
                scope["root_path"] = self.root_path
            scope["app"] = self
            await stack(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def _telemetry_enabled(self) -> bool:
        now = monotonic()
        if now - self._telemetry_checked_at >= TELEMETRY_RECHECK_S:
            native = getattr(self, "_native_telemetry", None)  # FastAPI >= 0.13x; absent: assume on
            self._telemetry_on = native is None or bool(native.enabled())
            self._telemetry_checked_at = now
        return self._telemetry_on
