"""Classify images with the example's ensemble through Triton's own client, HTTP or gRPC.

    python examples/image_classification/client.py [--grpc] [--url HOST:PORT]
        [--model image_classifier] [IMAGE ...]

Without images it sends one generated picture. Each image travels as one BYTES element (the
file's bytes, decoded on the server by the preprocess model); the answer is the top-3
"score:index:label" strings.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np


def sample_image() -> bytes:
    """A 96x96 PNG gradient (any format Pillow reads will do)."""
    from PIL import Image

    y, x = np.mgrid[0:96, 0:96]
    pixels = np.stack([x * 2, y * 2, (x + y)], axis=-1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def classify(
    url: str, images: list[bytes], model: str = "image_classifier", grpc: bool = False
) -> list[list[str]]:
    """One request carrying every image as a row; the top-k labels of each."""
    if grpc:
        import tritonclient.grpc as client_module
    else:
        import tritonclient.http as client_module
    client = client_module.InferenceServerClient(url)
    batch = np.array([[data] for data in images], dtype=np.object_)
    tensor = client_module.InferInput("IMAGE", list(batch.shape), "BYTES")
    tensor.set_data_from_numpy(batch)
    result = client.infer(model, [tensor], outputs=[client_module.InferRequestedOutput("LABELS")])
    return [[label.decode() for label in row] for row in result.as_numpy("LABELS")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("images", nargs="*", type=Path)
    parser.add_argument("--grpc", action="store_true", help="gRPC instead of HTTP")
    parser.add_argument("--url", help="host:port (default localhost:8000, or :8001 with --grpc)")
    parser.add_argument("--model", default="image_classifier")
    args = parser.parse_args()
    url = args.url or ("localhost:8001" if args.grpc else "localhost:8000")
    images = [p.read_bytes() for p in args.images] or [sample_image()]
    names = [str(p) for p in args.images] or ["(generated)"]
    for name, labels in zip(names, classify(url, images, args.model, args.grpc), strict=True):
        print(name, labels)


if __name__ == "__main__":
    main()
