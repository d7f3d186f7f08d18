"""Conveniences over the same admission path as KServe infer: images in, images out.

- ``POST /v2/models/{m}/classify``: a JPEG/PNG upload (multipart field 'file', or the raw
  body) -> top-k classes of an image classifier.
- ``GET /v2/models/{m}/generate?seed=7&steps=20&scale=4``: a diffusion model's ``image``
  output as an 8-bit PNG, enlarged ``scale`` times with nearest-neighbour pixels so a 32x32
  sample is visible in a browser. It runs exactly what infer runs for inputs ``seed=[7]``,
  ``steps=[20]`` (same batcher, queue, limits and timing headers).
- ``GET /v2/models/{m}/generate?prompt=a+cat&seed=7&steps=20&guidance_scale=7.5&height=&width=``
  on a text-to-image model: its UINT8 ``image`` [H, W, 3] as a PNG; the parameters given
  become the request's inputs (``prompt``, ``negative_prompt``, ``seed``, ``steps``,
  ``guidance_scale``, ``height``, ``width``), those left out take the model's defaults.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from wattserve.engines.base import Engine
from wattserve.server.core.admission import Refused, admit
from wattserve.server.core.request import BadRequest, InferRequest
from wattserve.server.http.preprocess_threads import preprocess_executor
from wattserve.server.http.routes.body import read_upload
from wattserve.server.http.routes.common import (
    error_response,
    json_response,
    refusal_response,
    timing_headers,
    watching_submit,
)
from wattserve.server.models.model_set import ModelSet
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.settings import Settings

MAX_SCALE = 16


def image_to_png(image: np.ndarray, scale: int = 1) -> bytes:
    """FP32 [C, H, W] in [0, 1] (C = 1 or 3), or UINT8 [H, W, 3] -> PNG bytes, each pixel
    ``scale`` x ``scale``."""
    from PIL import Image

    if image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3:
        pixels = image
    elif image.ndim != 3 or image.shape[0] not in (1, 3):
        raise ValueError(f"expected an image [1 or 3, H, W] or UINT8 [H, W, 3], got shape {image.shape}")
    else:
        pixels = np.clip(np.rint(np.asarray(image, np.float32) * 255.0), 0, 255).astype(np.uint8)
        pixels = pixels.transpose(1, 2, 0)
    if scale > 1:
        pixels = pixels.repeat(scale, axis=0).repeat(scale, axis=1)
    picture = Image.fromarray(pixels[..., 0] if pixels.shape[2] == 1 else pixels)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def images_router(models: ModelSet, settings: Settings) -> APIRouter:
    router = APIRouter()
    retry_after_s = settings.retry_after_s

    @router.post("/v2/models/{name}/classify")
    async def classify(name: str, request: Request, top_k: int = 5) -> Response:
        """Upload a JPEG/PNG (multipart field 'file', or the raw body); get the top-k classes."""
        from wattserve.server.http.image_preprocess import preprocess_image
        from wattserve.server.http.image_preprocess import top_k as best_classes

        if not 1 <= top_k <= 1000:
            return error_response("top_k must be within 1..1000", 400)

        async def decode(runtime: ModelRuntime, request: Request) -> tuple[InferRequest, Engine]:
            engine = runtime.engine
            if engine is None or [s.name for s in engine.inputs] != ["input"]:
                raise BadRequest(f"model {name!r} takes tensors, not images")
            data = await read_upload(request, settings.max_body_bytes)
            args = (data, runtime.serving.engine.model, settings.max_image_pixels)
            tensor = await asyncio.get_running_loop().run_in_executor(
                preprocess_executor(), preprocess_image, *args
            )
            expected = tuple(engine.inputs[0].shape)
            if tensor.shape != expected:
                raise BadRequest(f"preprocessed image is {tensor.shape}, model expects {expected}")
            return InferRequest(id=None, inputs={"input": tensor}, batched=False), engine

        try:
            done = await admit(models, name, None, decode, request, watching_submit)
        except Refused as refused:
            return refusal_response(refused, retry_after_s, request)
        logits = next(iter(done.result.outputs.values()))[0]
        classes = best_classes(logits, done.runtime.serving.engine.model, top_k)
        return json_response({"model_name": name, "top_k": classes}, headers=timing_headers(done.result))

    @router.get("/v2/models/{name}/generate")
    async def generate_png(
        name: str,
        request: Request,
        seed: int = Query(0, ge=0, description="Seed of the request's own noise generator."),
        steps: int = Query(0, ge=0, description="Denoising steps; 0: the server's default."),
        scale: int = Query(1, ge=1, le=MAX_SCALE, description="Nearest-neighbour enlargement."),
        priority: int = Query(0, ge=0, description="Triton priority level; 0: the default."),
        timeout_ms: float | None = Query(None, gt=0, description="Deadline; 503 when passed."),
        prompt: str | None = Query(None, description="Text-to-image: the prompt."),
        negative_prompt: str | None = Query(None, description="Text-to-image: the negative prompt."),
        guidance_scale: float | None = Query(None, description="Text-to-image: guidance scale."),
        height: int | None = Query(None, description="Text-to-image: image height in pixels."),
        width: int | None = Query(None, description="Text-to-image: image width in pixels."),
    ) -> Response:
        text = {"prompt": prompt, "negative_prompt": negative_prompt}
        numbers = {"guidance_scale": (guidance_scale, np.float32), "height": (height, np.int32),
                   "width": (width, np.int32)}  # fmt: skip

        async def decode(runtime: ModelRuntime, _: Request) -> tuple[InferRequest, Engine | None]:
            engine = runtime.engine
            names = {s.name for s in engine.inputs} if engine is not None else {"seed", "steps"}
            if "prompt" in names:  # text-to-image: what was given; the model fills the rest
                inputs = {k: np.array([v.encode()], dtype=object) for k, v in text.items() if v is not None}
                inputs |= {k: np.array([v], dtype) for k, (v, dtype) in numbers.items() if v is not None}
                inputs |= {"seed": np.array([seed], np.int64), "steps": np.array([steps], np.int32)}
            elif names != {"seed", "steps"}:
                raise BadRequest(f"model {name!r} is not a diffusion model (no seed/steps inputs)")
            else:
                inputs = {"seed": np.array([seed], np.int64), "steps": np.array([steps], np.int32)}
            timeout_us = int(timeout_ms * 1000) if timeout_ms is not None else None
            decoded = InferRequest(
                id=None, inputs=inputs, batched=False, priority=priority, timeout_us=timeout_us
            )
            return decoded, engine

        try:
            done = await admit(models, name, None, decode, request, watching_submit)
        except Refused as refused:
            return refusal_response(refused, retry_after_s)
        png = await asyncio.to_thread(image_to_png, done.result.outputs["image"][0], scale)
        return Response(png, media_type="image/png", headers=timing_headers(done.result))

    return router
