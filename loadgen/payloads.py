"""Request bodies for a KServe v2 model: random tensors (JSON or binary extension) or images.

Bodies are built once, before the run, and cycled through, so the generator spends its time
sending rather than encoding. Each body is a batch of one (the -1 batch dimension becomes 1).
Strings (BYTES) are random ASCII of ``string_length`` characters, as perf_analyzer's
``--string-length`` (default 128), or one given value (``--string-data``, ``--input-value``);
BF16 goes as its raw 16 bits in the binary extension and as the numbers it holds in JSON.
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
from wattserve.server.core.bytes_tensors import serialize_bytes

PROTOCOLS = ("auto", "binary", "json", "image")

_DTYPES = DATATYPE_TO_NUMPY  # one table of KServe datatypes for server and client
STRING_LENGTH = 128  # perf_analyzer's --string-length default
_STRING_ALPHABET = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", np.uint8)
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
    metadata: Mapping[str, Any],
    shape_overrides: Mapping[str, Sequence[int]] | None = None,
    allow_variable: bool = False,
) -> list[InputSpec]:
    """Inputs from model metadata, with every -1 made concrete (batch 1 for the first dim).

    ``allow_variable`` keeps other -1 dimensions (input data that gives its own shapes)."""
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
            if any(d < 0 for d in shape) and not allow_variable:
                raise ValueError(
                    f"input {name!r} has a variable dimension {list(inp['shape'])}; "
                    f"give a concrete shape with --input-shape {name}=..."
                )
        if datatype not in _DTYPES:
            raise ValueError(f"input {name!r}: datatype {datatype} is not a KServe v2 datatype")
        specs.append(InputSpec(name, datatype, shape))
    if not specs:
        raise ValueError("model metadata lists no inputs")
    return specs


def random_tensor(
    spec: InputSpec,
    rng: np.random.Generator,
    fixed: float | str | None = None,
    string_length: int = STRING_LENGTH,
) -> np.ndarray:
    """Random data of the input's shape and type (standard normal floats, small integers,
    ASCII strings of ``string_length``), or ``fixed`` in every element."""
    if spec.datatype == "BYTES":
        if fixed is not None:
            return np.full(spec.shape, str(fixed).encode(), dtype=object)
        return random_strings(spec.shape, rng, string_length)
    dtype = _DTYPES[spec.datatype]
    if fixed is not None:
        try:
            return np.full(spec.shape, float(fixed), dtype=dtype)
        except ValueError:
            raise ValueError(f"input {spec.name!r} ({spec.datatype}) needs a number, not {fixed!r}") from None
    if dtype.kind == "f" or spec.datatype == "BF16":
        return rng.standard_normal(spec.shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(spec.shape) < 0.5
    high = 256 if dtype.itemsize == 1 else 100
    return rng.integers(0, high, size=spec.shape).astype(dtype)


def random_strings(shape: tuple[int, ...], rng: np.random.Generator, length: int) -> np.ndarray:
    """An object array of ``bytes``, each ``length`` random letters and digits."""
    count = int(np.prod(shape, dtype=np.int64))
    letters = _STRING_ALPHABET[rng.integers(0, len(_STRING_ALPHABET), size=(count, length))]
    out = np.empty(count, dtype=object)
    for i in range(count):
        out[i] = letters[i].tobytes()
    return out.reshape(shape)


class UnencodableError(ValueError):
    """Data one protocol cannot carry (bytes that are not UTF-8 text, in JSON)."""


def _json_data(datatype: str, tensor: np.ndarray) -> list[Any]:
    flat = tensor.reshape(-1)
    if datatype == "BYTES":  # JSON strings (UTF-8 text)
        try:
            return [v.decode() if isinstance(v, bytes) else str(v) for v in flat]
        except UnicodeDecodeError:
            raise UnencodableError("JSON cannot carry BYTES that are not UTF-8 text (use --binary)") from None
    if datatype == "BF16":  # the numbers BF16 holds, exactly, as FP32
        return flat.astype(np.float32).tolist()
    return flat.tolist()


def _raw(datatype: str, tensor: np.ndarray) -> bytes:
    """One input's bytes in the binary extension: little-endian elements, BYTES each behind
    a 4-byte length, BF16 as its 16 bits."""
    if datatype == "BYTES":
        return serialize_bytes(np.asarray(tensor, dtype=object))
    array = np.ascontiguousarray(tensor, dtype=_DTYPES[datatype])
    if datatype == "BF16":
        return array.view(np.uint16).astype("<u2").tobytes()
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def json_body(specs: Sequence[InputSpec], tensors: Mapping[str, np.ndarray]) -> bytes:
    """A JSON inference request (row-major flattened data)."""
    return orjson.dumps(
        {
            "inputs": [
                {
                    "name": s.name,
                    "shape": list(s.shape),
                    "datatype": s.datatype,
                    "data": _json_data(s.datatype, tensors[s.name]),
                }
                for s in specs
            ]
        }
    )


def binary_body(specs: Sequence[InputSpec], tensors: Mapping[str, np.ndarray]) -> tuple[bytes, int]:
    """A binary-extension request: JSON header, then each input's raw little-endian bytes.

    Returns the body and the header length for ``Inference-Header-Content-Length``.
    """
    raw = [_raw(s.datatype, tensors[s.name]) for s in specs]
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": s.name,
                    "shape": list(s.shape),
                    "datatype": s.datatype,
                    "parameters": {"binary_data_size": len(r)},
                }
                for s, r in zip(specs, raw, strict=True)
            ],
            "parameters": {"binary_data_output": True},
        }
    )
    return header + b"".join(raw), len(header)


def tensor_requests(
    model: str,
    specs: Sequence[InputSpec],
    protocol: str,
    count: int,
    seed: int,
    fixed_values: Mapping[str, float | str] | None = None,
    string_length: int = STRING_LENGTH,
) -> list[PreparedRequest]:
    """``count`` distinct random requests for the ``json`` or ``binary`` protocol."""
    if string_length < 0:
        raise ValueError(f"string length must be >= 0, not {string_length}")
    rng = np.random.default_rng(seed)
    fixed = fixed_values or {}
    tensor_sets = [
        {s.name: random_tensor(s, rng, fixed.get(s.name), string_length) for s in specs} for _ in range(count)
    ]
    return encode_requests(model, specs, protocol, tensor_sets)


def encode_requests(
    model: str, specs: Sequence[InputSpec], protocol: str, tensor_sets: Sequence[Mapping[str, np.ndarray]]
) -> list[PreparedRequest]:
    """One ``json`` or ``binary`` request per set of input tensors; each input's shape is its
    tensor's (given input data may vary it from request to request)."""
    if protocol not in ("json", "binary"):
        raise ValueError(f"tensor requests need protocol json or binary, not {protocol!r}")
    path = f"/v2/models/{model}/infer"
    out = []
    for tensors in tensor_sets:
        shaped = [InputSpec(s.name, s.datatype, tuple(np.shape(tensors[s.name]))) for s in specs]
        if protocol == "json":
            out.append(
                PreparedRequest(path, json_body(shaped, tensors), {"Content-Type": "application/json"})
            )
        else:
            body, header_len = binary_body(shaped, tensors)
            headers = {
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(header_len),
            }
            out.append(PreparedRequest(path, body, headers))
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
