"""KServe v2 inference: ``POST /v2/models/{m}[/versions/{v}]/infer``, the hot path.

Plain Starlette routes (the app puts them first in its table): FastAPI's parameter
machinery cost ~100 us a request here, more than the identity model's whole budget.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from wattserve.server.admission import BodyBudget, Refused, admit, check_content_type, reserved_body
from wattserve.server.codec import BINARY_HEADER, InferRequest, encode_infer_response, parse_infer_request
from wattserve.server.model_set import ModelSet
from wattserve.server.routes.common import refusal_response, timing_headers, watching_submit
from wattserve.server.runtime import ModelRuntime
from wattserve.server.settings import Settings

OFFLOAD_DECODE_BYTES = 256 * 1024  # bodies above this are decoded on a worker thread


def inference_routes(models: ModelSet, settings: Settings, body_budget: BodyBudget) -> list[Route]:
    retry_after_s = settings.retry_after_s

    async def infer(request: Request) -> Response:
        params = request.path_params
        name = params["name"]
        engines = []  # the engine the request was decoded for (an unload may clear runtime.engine)

        async def decode(runtime: ModelRuntime) -> InferRequest:
            engine = runtime.engine
            if engine is None:
                raise Refused(f"model {name!r} is unloading", 503, retry_after=True, body_unread=True)
            engines.append(engine)
            check_content_type(request)
            async with reserved_body(request, settings.max_body_bytes, body_budget) as held:
                body = held[0]
                args = (body, request.headers.get(BINARY_HEADER), engine.inputs, engine.outputs,
                        runtime.request_max_batch, runtime.settings.check_values)  # fmt: skip
                if len(body) > OFFLOAD_DECODE_BYTES:
                    return await asyncio.to_thread(parse_infer_request, *args)
                return parse_infer_request(*args)

        try:
            done = await admit(models, name, params.get("version"), decode, watching_submit(request))
        except Refused as refused:
            return refusal_response(refused, retry_after_s, request)
        payload, extra = encode_infer_response(name, done.request, [r.outputs for r in done.results],
                                               engines[0].outputs, done.runtime.version)  # fmt: skip
        media = "application/octet-stream" if extra else "application/json"
        return Response(payload, media_type=media, headers={**extra, **timing_headers(done.results)})

    paths = ("/v2/models/{name}/infer", "/v2/models/{name}/versions/{version}/infer")
    return [Route(path, infer, methods=["POST"]) for path in paths]
