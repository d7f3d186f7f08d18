"""Triton's BYTES tensors (TYPE_STRING in a config) on every wire format.

In memory a BYTES tensor is a numpy ``object`` array whose elements are ``bytes``. On
the wire (Triton's protocol and its client libraries):

- JSON ``data``: a flat (or nested) list of strings, UTF-8 text;
- the binary extension and gRPC ``raw_input_contents``/``raw_output_contents``: each
  element as a 4-byte little-endian length followed by its bytes, elements in row-major
  order (``tritonclient.utils.serialize_byte_tensor``);
- gRPC typed contents: ``bytes_contents``, one entry per element.

Decoding is bounded by what was received: every length is checked against the bytes
left before anything is copied, so a forged length costs nothing.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from wattserve.batchers.status import Status

BYTES = "BYTES"
_LENGTH = struct.Struct("<I")


class BytesTensorError(ValueError):
    """A malformed BYTES tensor; the request's fault (INVALID_ARG)."""

    status = Status.INVALID_ARG


def deserialize_bytes(chunk: bytes | memoryview, name: str, shape: Sequence[int]) -> np.ndarray:
    """Length-prefixed elements -> an object array of ``shape``; every byte accounted for."""
    count = math.prod(shape)
    view = memoryview(chunk)
    size = len(view)
    if count * _LENGTH.size > size:
        raise BytesTensorError(f"input {name!r}: {size} bytes cannot hold {count} BYTES elements "
                               "(each needs a 4-byte length)")  # fmt: skip
    out = np.empty(count, dtype=object)
    offset = 0
    unpack = _LENGTH.unpack_from
    for i in range(count):
        if offset + 4 > size:
            raise BytesTensorError(f"input {name!r}: BYTES element {i} has no length (data ends at {size})")
        (length,) = unpack(view, offset)
        offset += 4
        end = offset + length
        if end > size:
            raise BytesTensorError(f"input {name!r}: BYTES element {i} of {length} bytes runs past the "
                                   f"{size}-byte tensor")  # fmt: skip
        out[i] = bytes(view[offset:end])
        offset = end
    if offset != size:
        raise BytesTensorError(f"input {name!r}: {size - offset} bytes left after {count} BYTES elements "
                               f"of shape {list(shape)}")  # fmt: skip
    return out.reshape(shape)


def serialize_bytes(array: np.ndarray) -> bytes:
    """An object array of bytes (or str, UTF-8 encoded) -> length-prefixed elements."""
    parts: list[bytes] = []
    pack = _LENGTH.pack
    for value in array.ravel():
        item = _as_bytes(value)
        parts.append(pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def bytes_from_json(data: Any, name: str, shape: Sequence[int]) -> np.ndarray:
    """JSON ``data`` of a BYTES input: strings (flat or nested), one per element."""
    if data is None:
        raise BytesTensorError(f"input {name!r} has neither 'data' nor binary_data_size")
    flat = _flatten(data, name)
    return _shaped(flat, name, shape, "string")


def bytes_from_values(values: Any, name: str, shape: Sequence[int]) -> np.ndarray:
    """gRPC ``bytes_contents`` (a repeated bytes field), one entry per element."""
    flat = [v if isinstance(v, bytes) else _text(v, name) for v in values]
    return _shaped(flat, name, shape, "bytes")


def bytes_to_json(array: np.ndarray) -> list[str]:
    """Output elements as JSON strings (bytes that are not UTF-8 get U+FFFD: JSON holds
    text only; the binary extension carries them exactly)."""
    return [_as_bytes(v).decode("utf-8", "replace") for v in array.ravel()]


def _shaped(flat: list[bytes], name: str, shape: Sequence[int], what: str) -> np.ndarray:
    count = math.prod(shape)
    if len(flat) != count:
        raise BytesTensorError(f"input {name!r}: {len(flat)} {what} elements for shape {list(shape)} "
                               f"({count} expected)")  # fmt: skip
    out = np.empty(count, dtype=object)
    out[:] = flat
    return out.reshape(shape)


def _flatten(data: Any, name: str) -> list[bytes]:
    if isinstance(data, str):
        return [data.encode()]
    if not isinstance(data, list):
        raise BytesTensorError(f"input {name!r}: BYTES data must be strings, got {type(data).__name__}")
    flat: list[bytes] = []
    stack = [iter(data)]
    while stack:  # iterative: a deeply nested body cannot exhaust the interpreter's stack
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(_text(value, name))
        else:
            stack.pop()
    return flat


def _text(value: Any, name: str) -> bytes:
    if isinstance(value, str):
        return value.encode()
    raise BytesTensorError(f"input {name!r}: BYTES data must be strings, got {type(value).__name__}")


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, np.bytes_ | bytearray | memoryview):
        return bytes(value)
    return str(value).encode()
