"""Images in, top-k classes out: torchvision's own preprocessing for the served model."""

from __future__ import annotations

import io
from functools import lru_cache

import numpy as np
from wattserve.batchers.status import Status
from wattserve.server.core.request import BadRequest


@lru_cache(maxsize=8)
def _preset(model_name: str):
    """(transform, categories) from the model's DEFAULT weights entry; no download."""
    import torchvision

    weights = torchvision.models.get_model_weights(model_name).DEFAULT
    return weights.transforms(), list(weights.meta["categories"])


def categories(model_name: str) -> list[str]:
    return _preset(model_name)[1]


DECODE_AT_LEAST = 512  # JPEGs are decoded at the smallest 1/2^k scale that keeps this many pixels a side


def preprocess_image(data: bytes, model_name: str, max_pixels: int = 25_000_000) -> np.ndarray:
    """Decode a JPEG/PNG and apply the model's resize/crop/normalize; FP32 [3, H, W].

    The decoded size is checked from the header before any pixel is decoded (a 186 KB PNG
    can decode to 8000x8000, 1.5 GB), and JPEGs are decoded already scaled down.
    Blocking (decode + resize): call it off the event loop.
    """
    from PIL import Image, UnidentifiedImageError
    from torchvision.transforms.functional import pil_to_tensor

    if not data:
        raise BadRequest("empty image upload")
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
        width, height = image.size
        if width * height > max_pixels:
            raise BadRequest(
                f"image of {width}x{height} pixels exceeds the {max_pixels}-pixel limit", Status.TOO_LARGE
            )
        if image.format == "JPEG":
            image.draft("RGB", (DECODE_AT_LEAST, DECODE_AT_LEAST))
        image.load()
    except BadRequest:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise BadRequest(f"unreadable image: {exc}") from None
    transform, _ = _preset(model_name)
    tensor = transform(pil_to_tensor(image.convert("RGB")))
    return tensor.numpy().astype(np.float32, copy=False)


def top_k(logits: np.ndarray, model_name: str, k: int) -> list[dict[str, object]]:
    """Softmax scores of the ``k`` best classes, best first."""
    z = logits.astype(np.float64) - logits.max()
    probs = np.exp(z) / np.exp(z).sum()
    best = np.argsort(-probs)[:k]
    names = categories(model_name)
    return [{"index": int(i), "label": names[i], "score": float(probs[i])} for i in best]
