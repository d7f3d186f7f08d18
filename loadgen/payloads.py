"""Request bodies for a KServe v2 model: random tensors (JSON or binary extension) or images.

Bodies are built once, before the run, and cycled through, so the generator spends its time
sending rather than encoding. Each body is a batch of one (the -1 batch dimension becomes 1).
"""

from __future__ import annotations

import mimetypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from wattserve.engines.base import DATATYPE_TO_NUMPY

PROTOCOLS = ("auto", "binary", "json", "image")

_DTYPES = DATATYPE_TO_NUMPY  # one table of KServe datatypes for server and client
# Datatypes the generator has no random data for yet (strings need a length policy; BF16's
# numpy type has no byte-order view): a run against such a model is refused up front.
NO_RANDOM_DATA = ("BYTES", "BF16")
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp"}


@dataclass(frozen=True)
class InputSpec:
    """One model input from ``GET /v2/models/{m}``: name, datatype, shape with batch dim 1."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass
class PreparedRequest:
    """What the client sends for one request: path suffix, body bytes (or files) and headers."""

    path: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    file: tuple[str, bytes, str] | None = None  # (filename, content, content type) for multipart


def input_specs(
    metadata: Mapping[str, Any], shape_overrides: Mapping[str, Sequence[int]] | None = None
) -> list[InputSpec]:
    """Inputs from model metadata, with every -1 made concrete (batch 1 for the first dim)."""
    overrides = shape_overrides or {}
    specs = []
    for inp in metadata.get("inputs", []):
        name, datatype = inp["name"], inp["datatype"]
        if name in overrides:
            shape = tuple(int(d) for d in overrides[name])
        else:
            shape = tuple(int(d) for d in inp["shape"])
            if shape and shape[0] == -1:
                shape = (1, *shape[1:])
            if any(d < 0 for d in shape):
                raise ValueError(
                    f"input {name!r} has a variable dimension {list(inp['shape'])}; "
                    f"give a concrete shape with --input-shape {name}=..."
                )
        if datatype not in _DTYPES or datatype in NO_RANDOM_DATA:
            raise ValueError(f"input {name!r}: datatype {datatype} is not supported for random data")
        specs.append(InputSpec(name, datatype, shape))
    if not specs:
        raise ValueError("model metadata lists no inputs")
    return specs


def random_tensor(spec: InputSpec, rng: np.random.Generator, fixed: float | None = None) -> np.ndarray:
    """Random data of the input's shape and type (standard normal floats, small integers)."""
    dtype = _DTYPES[spec.datatype]
    if fixed is not None:
        return np.full(spec.shape, fixed, dtype=dtype)
    if dtype.kind == "f":
        return rng.standard_normal(spec.shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(spec.shape) < 0.5
    high = 256 if dtype.itemsize == 1 else 100
    return rng.integers(0, high, size=spec.shape).astype(dtype)


def json_body(specs: Sequence[InputSpec], tensors: Mapping[str, np.ndarray]) -> bytes:
    """A JSON inference request (row-major flattened data)."""
    return orjson.dumps(
        {
            "inputs": [
                {
                    "name": s.name,
                    "shape": list(s.shape),
                    "datatype": s.datatype,
                    "data": tensors[s.name].reshape(-1).tolist(),
                }
                for s in specs
            ]
        }
    )


def binary_body(specs: Sequence[InputSpec], tensors: Mapping[str, np.ndarray]) -> tuple[bytes, int]:
    """A binary-extension request: JSON header, then each input's raw little-endian bytes.

    Returns the body and the header length for ``Inference-Header-Content-Length``.
    """
    raw = [np.ascontiguousarray(tensors[s.name]).astype(_DTYPES[s.datatype].newbyteorder("<")) for s in specs]
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": s.name,
                    "shape": list(s.shape),
                    "datatype": s.datatype,
                    "parameters": {"binary_data_size": int(r.nbytes)},
                }
                for s, r in zip(specs, raw, strict=True)
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    return header + b"".join(r.tobytes() for r in raw), len(header)


def tensor_requests(
    model: str,
    specs: Sequence[InputSpec],
    protocol: str,
    count: int,
    seed: int,
    fixed_values: Mapping[str, float] | None = None,
) -> list[PreparedRequest]:
    """``count`` distinct random requests for the ``json`` or ``binary`` protocol."""
    rng = np.random.default_rng(seed)
    fixed = fixed_values or {}
    path = f"/v2/models/{model}/infer"
    out = []
    for _ in range(count):
        tensors = {s.name: random_tensor(s, rng, fixed.get(s.name)) for s in specs}
        if protocol == "json":
            out.append(PreparedRequest(path, json_body(specs, tensors), {"Content-Type": "application/json"}))
        elif protocol == "binary":
            body, header_len = binary_body(specs, tensors)
            headers = {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(header_len),
            }
            out.append(PreparedRequest(path, body, headers))
        else:
            raise ValueError(f"tensor requests need protocol json or binary, not {protocol!r}")
    return out


def image_requests(model: str, folder: str | Path, limit: int = 64) -> list[PreparedRequest]:
    """Multipart uploads (field ``file``) of the images in ``folder`` to the classify endpoint."""
    files = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) in {folder}")
    path = f"/v2/models/{model}/classify"
    out = []
    for p in files[:limit]:
        ctype = mimetypes.guess_type(p.name)[0] or "application/octet-stream"
        out.append(PreparedRequest(path, file=(p.name, p.read_bytes(), ctype)))
    return out
