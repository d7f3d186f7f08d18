"""A convenience endpoint for diffusion models: one GET, one PNG.

``GET /v2/models/{name}/generate?seed=7&steps=20&scale=4`` runs exactly what the KServe
infer route runs for inputs ``seed=[7]``, ``steps=[20]`` (same batcher, same queue, same
limits and timing headers) and answers the ``image`` output as an 8-bit PNG, enlarged
``scale`` times with nearest-neighbour pixels so a 32x32 sample is visible in a browser.

The app factory includes it with ``app.include_router(server.diffusion_routes.router)``;
the handler finds the runtime and settings on ``request.app.state``.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

router = APIRouter()

MAX_SCALE = 16


def image_to_png(image: np.ndarray, scale: int = 1) -> bytes:
    """FP32 [C, H, W] in [0, 1] (C = 1 or 3) -> PNG bytes, each pixel ``scale`` x ``scale``."""
    from PIL import Image

    if image.ndim != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"expected an image [1 or 3, H, W], got shape {image.shape}")
    pixels = np.clip(np.rint(np.asarray(image, np.float32) * 255.0), 0, 255).astype(np.uint8)
    pixels = pixels.transpose(1, 2, 0)
    if scale > 1:
        pixels = pixels.repeat(scale, axis=0).repeat(scale, axis=1)
    picture = Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


@router.get("/v2/models/{name}/generate")
async def generate_png(
    name: str,
    request: Request,
    seed: int = Query(0, ge=0, description="Seed of the request's own noise generator."),
    steps: int = Query(0, ge=0, description="Denoising steps; 0: the server's default."),
    scale: int = Query(1, ge=1, le=MAX_SCALE, description="Nearest-neighbour enlargement."),
    priority: int = Query(0, ge=0, description="Triton priority level; 0: the default."),
    timeout_ms: float | None = Query(None, gt=0, description="Deadline; 504 when passed."),
) -> Response:
    # Imported here: server.app includes this router, so a module-level import would cycle.
    from server.app import _refuse_if_not_serving, answer_or_disconnect, error_response, timing_headers

    runtime = request.app.state.runtime
    settings = request.app.state.settings
    metrics = runtime.metrics
    if name != settings.model:
        return error_response(f"unknown model {name!r}; this server serves {settings.model!r}", 404)
    engine = runtime.engine
    if engine is not None and {s.name for s in engine.inputs} != {"seed", "steps"}:
        metrics.outcome["bad_request"].inc()
        return error_response(f"model {name!r} is not a diffusion model (no seed/steps inputs)", 400)
    if (refused := _refuse_if_not_serving(runtime, settings)) is not None:
        return refused
    inputs = {"seed": np.array([seed], np.int64), "steps": np.array([steps], np.int32)}
    try:
        validate = getattr(engine, "validate", None)
        if validate is not None:
            validate(inputs)
        timeout_us = int(timeout_ms * 1000) if timeout_ms is not None else None
        item = runtime.make_item(inputs, priority, timeout_us)
    except ValueError as exc:
        metrics.outcome["bad_request"].inc()
        return error_response(str(exc), 400)
    outcome = await answer_or_disconnect(request, runtime, [item])
    if isinstance(outcome, Response):
        return outcome
    png = await asyncio.to_thread(image_to_png, outcome[0].outputs["image"], scale)
    return Response(png, media_type="image/png", headers=timing_headers(outcome))
