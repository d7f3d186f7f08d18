"""One request's scalar inputs, read for engines that take parameters as tensors (text to
image, language models): a number, a float or a UTF-8 string, each one element, with a
clear error for anything else (the server answers it as the request's 400)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np


def read_scalar(inputs: Mapping[str, np.ndarray], name: str, default: Any) -> Any:
    """The one element of input ``name``, or ``default`` when the request leaves it out."""
    value = inputs.get(name)
    if value is None:
        return default
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise ValueError(f"{name} must hold one element, got {flat.size}")
    return flat[0]


def read_number(inputs: Mapping[str, np.ndarray], name: str, default: int) -> int:
    value = read_scalar(inputs, name, default)
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{name} must be an integer, got {value!r}") from exc


def read_text(inputs: Mapping[str, np.ndarray], name: str, max_bytes: int, required: bool = False) -> str:
    """Input ``name`` as one UTF-8 string of at most ``max_bytes`` ("" when left out)."""
    if name not in inputs:
        if required:
            raise ValueError(f"{name} is required (BYTES, one UTF-8 string)")
        return ""
    value = read_scalar(inputs, name, b"")
    if isinstance(value, str):
        return value
    if not isinstance(value, bytes | bytearray | np.bytes_):
        raise ValueError(f"{name} must be BYTES (a UTF-8 string), got {type(value).__name__}")
    if len(value) > max_bytes:
        raise ValueError(f"{name} is {len(value)} bytes; at most {max_bytes}")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from exc
