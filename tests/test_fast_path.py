"""POST .../infer skips the framework's middleware stack (server.http.fast_path) unless the app
has middleware of its own; every other request, and every request of an app with access
control, takes the full stack."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
from starlette.responses import Response
from starlette.routing import Route
from wattserve.server.app import create_app
from wattserve.server.http.fast_path import InferenceFastPath
from wattserve.server.settings import Settings

from tests.gated_engine import GatedEngine

ROOT = Path(__file__).resolve().parent.parent


def _scope(method: str, path: str, kind: str = "http") -> dict:
    return {"type": kind, "method": method, "path": path, "root_path": "", "query_string": b"",
            "headers": [], "path_params": {}}  # fmt: skip


async def _call(app, scope) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent


async def test_only_a_post_the_inference_routes_match_skips_the_stack():
    seen: list[tuple] = []

    async def stack(scope, receive, send):
        seen.append(("stack", scope["type"], scope.get("method"), scope.get("path")))

    async def endpoint(request):
        seen.append(("endpoint", dict(request.path_params)))
        return Response(b"ok")

    fast = InferenceFastPath(stack, [Route("/v2/models/{name}/infer", endpoint, methods=["POST"])])
    sent = await _call(fast, _scope("POST", "/v2/models/m1/infer"))
    assert seen == [("endpoint", {"name": "m1"})]
    assert sent[0]["status"] == 200 and sent[1]["body"] == b"ok"
    for method, path, kind in [("GET", "/v2/models/m1/infer", "http"), ("POST", "/v2/repository/models/m1/load", "http"),
                               ("POST", "/v2/models/m1/infer/extra", "http"), (None, "", "lifespan")]:  # fmt: skip
        seen.clear()
        scope = _scope(method, path, kind) if kind == "http" else {"type": "lifespan"}
        await _call(fast, scope)
        assert seen and seen[0][0] == "stack", (method, path)


async def test_an_unexpected_exception_is_the_apps_json_500():
    async def stack(scope, receive, send):
        raise AssertionError("not reached")

    async def endpoint(request):
        raise RuntimeError("a bug")

    fast = InferenceFastPath(stack, [Route("/v2/models/{name}/infer", endpoint, methods=["POST"])])
    sent = await _call(fast, _scope("POST", "/v2/models/m/infer"))
    assert sent[0]["status"] == 500
    assert (b"connection", b"close") in sent[0]["headers"]
    assert orjson.loads(sent[1]["body"]) == {"error": "internal server error"}


def test_the_app_uses_the_fast_path_only_without_middleware_of_its_own():
    def app_for(**settings):
        return create_app(Settings(model="gated", **settings), engine_factory=lambda s: GatedEngine())

    assert isinstance(app_for().build_middleware_stack(), InferenceFastPath)
    guarded = app_for(api_token="tok").build_middleware_stack()
    assert not isinstance(guarded, InferenceFastPath), "access control sees every request"


# FastAPI's OpenTelemetry check, cached (WattserveApp.__call__). A tracer provider is process
# global and cannot be unset, so the traced case runs in a fresh interpreter.
TRACED = textwrap.dedent(
    """
    import asyncio, json, sys
    from opentelemetry import trace
    from wattserve.server.app import create_app
    from wattserve.server.settings import Settings
    from tests.test_fast_path import identity_request

    class Recording(trace.NoOpTracer):
        spans = []
        def start_span(self, name, context=None, kind=None, attributes=None, **kwargs):
            Recording.spans.append((name, dict(attributes or {}).get("url.path")))
            return super().start_span(name, context, kind, attributes, **kwargs)

    class Provider(trace.TracerProvider):  # a configured provider, as an OpenTelemetry SDK sets one
        def get_tracer(self, *args, **kwargs):
            return Recording()

    async def main():
        app = create_app(Settings(model="identity", telemetry=False, grpc_port=0))
        async with app.router.lifespan_context(app):
            first = await identity_request(app)
            trace.set_tracer_provider(Provider())  # set after start: noticed within a second
            await asyncio.sleep(1.1)
            second = await identity_request(app)
        print(json.dumps({"statuses": [first, second], "spans": Recording.spans}))

    asyncio.run(main())
    """
)


async def identity_request(app) -> int:
    body = orjson.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}]}
    )
    scope = {**_scope("POST", "/v2/models/identity/infer"), "http_version": "1.1", "scheme": "http",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}  # fmt: skip
    scope.pop("path_params")
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"]


async def test_the_telemetry_question_is_asked_once_a_second_not_per_request():
    app = create_app(Settings(model="identity", telemetry=False, grpc_port=0))
    asked = []
    native = app._native_telemetry
    real = native.enabled
    native.enabled = lambda: asked.append(1) or real()
    async with app.router.lifespan_context(app):
        started = time.monotonic()
        statuses = [await identity_request(app) for _ in range(50)]
        seconds = time.monotonic() - started
    assert statuses == [200] * 50
    # FastAPI asks once itself (the first request builds the stack), then the cache once a second
    assert len(asked) <= 2 + seconds, "asked once a second, not once per request"


def test_a_provider_set_after_start_gets_spans_for_inference_requests():
    out = subprocess.run([sys.executable, "-c", TRACED], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, check=True)  # fmt: skip
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["statuses"] == [200, 200]
    assert report["spans"] == [["POST", "/v2/models/identity/infer"]], "only the request after the provider"
