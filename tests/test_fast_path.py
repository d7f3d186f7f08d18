"""POST .../infer skips the framework's middleware stack (server.fast_path) unless the app
has middleware of its own; every other request, and every request of an app with access
control, takes the full stack."""

from __future__ import annotations

import orjson
from starlette.responses import Response
from starlette.routing import Route
from wattserve.server.app import create_app
from wattserve.server.fast_path import InferenceFastPath
from wattserve.server.settings import Settings

from tests.gated_engine import GatedEngine


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
