"""Real input data for the load generator, in perf_analyzer's ``--input-data`` forms.

Some models' speed (or validity) depends on what they are sent: a string input that must be
an encoded image, token ids in range, a sequence of a real length. perf_analyzer users keep
such data in two forms, read here unchanged:

- a JSON file ``{"data": [{INPUT: VALUE, ...}, ...]}``, one entry per request, sent round
  robin; VALUE is the flattened (or nested) row-major content, ``{"content": [...],
  "shape": [...]}`` for an input with variable dimensions, or ``{"b64": "..."}`` for the
  tensor's bytes as they go on the wire (numbers: little-endian elements; BYTES: each
  element behind its 4-byte little-endian length, as perf_analyzer sends them). Shapes leave
  out the batch dimension of a batching model (a batch of one is sent), as perf_analyzer's;
- a directory with one file per input, named as the input: raw little-endian elements for a
  batch-1 request, or for BYTES one UTF-8 string per line.

Every entry is checked against the model's metadata before the run (names, element counts),
so a wrong file fails with the entry and input it is about instead of a run of 400s.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from wattserve.engines.base import DATATYPE_TO_NUMPY
from wattserve.server.core.bytes_tensors import BytesTensorError, deserialize_bytes

from .payloads import InputSpec


class InputDataError(ValueError):
    """Input data that does not fit the model: which entry, which input, and why."""


def load_input_data(source: str | Path, specs: Sequence[InputSpec]) -> list[dict[str, np.ndarray]]:
    """The tensor sets a JSON file or a directory describes, one per request to send."""
    path = Path(source)
    if path.is_dir():
        return [_from_directory(path, specs)]
    if not path.is_file():
        raise InputDataError(f"--input-data {source}: no such file or directory (or random, zero)")
    try:
        doc = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputDataError(f"{path}: not JSON ({exc})") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise InputDataError(
            f'{path}: expected {{"data": [{{INPUT: VALUE, ...}}, ...]}} with at least one entry'
        )
    return [_entry(path, i, entry, specs) for i, entry in enumerate(entries)]


def _entry(path: Path, index: int, entry: Any, specs: Sequence[InputSpec]) -> dict[str, np.ndarray]:
    where = f"{path} data[{index}]"
    if not isinstance(entry, dict):
        raise InputDataError(f"{where}: expected an object of inputs, got {type(entry).__name__}")
    names = {s.name for s in specs}
    unknown = sorted(set(entry) - names)
    if unknown:
        raise InputDataError(
            f"{where}: the model has no input {unknown[0]!r} (inputs: {', '.join(sorted(names))})"
        )
    tensors = {}
    for spec in specs:
        if spec.name not in entry:
            raise InputDataError(f"{where}: input {spec.name!r} is missing")
        tensors[spec.name] = _value(f"{where} {spec.name!r}", spec, entry[spec.name])
    return tensors


def _value(where: str, spec: InputSpec, value: Any) -> np.ndarray:
    shape: tuple[int, ...] = spec.shape
    if isinstance(value, dict):
        if "b64" not in value and "content" not in value:
            raise InputDataError(f'{where}: expected "content" or "b64"')
        if "shape" in value:
            shape = _shape(where, spec, value["shape"])
    _concrete(where, shape)
    if isinstance(value, dict) and "b64" in value:
        try:
            raw = base64.b64decode(value["b64"], validate=True)
        except (ValueError, TypeError) as exc:
            raise InputDataError(f"{where}: b64 is not base64 ({exc})") from None
        if spec.datatype == "BYTES":
            return _bytes_from_wire(where, raw, shape)
        return _sized(where, _from_raw(where, spec, raw), shape)
    if isinstance(value, dict):
        value = value["content"]
    try:
        flat = np.asarray(value, dtype=object).reshape(-1)
    except ValueError as exc:  # ragged nesting
        raise InputDataError(f"{where}: content is not a regular (row-major) array ({exc})") from None
    if spec.datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise InputDataError(f"{where}: a BYTES input takes strings")
        return _sized(where, np.array([v.encode() for v in flat], dtype=object), shape)
    try:
        array = np.asarray(flat.tolist()).astype(DATATYPE_TO_NUMPY[spec.datatype])
    except (ValueError, TypeError) as exc:
        raise InputDataError(f"{where}: not {spec.datatype} numbers ({exc})") from None
    return _sized(where, array, shape)


def _concrete(where: str, shape: tuple[int, ...]) -> None:
    if any(d < 0 for d in shape):
        raise InputDataError(f'{where}: the input has variable dimensions {list(shape)}; give "shape"')


def _shape(where: str, spec: InputSpec, given: Any) -> tuple[int, ...]:
    if not isinstance(given, list) or not all(isinstance(d, int) and d >= 0 for d in given):
        raise InputDataError(f"{where}: shape must be a list of dimensions >= 0, got {given!r}")
    if len(given) + 1 == len(spec.shape):  # without the batch dimension, as perf_analyzer's
        return (1, *given)
    if len(given) != len(spec.shape):
        raise InputDataError(f"{where}: shape {given} does not fit the input's {list(spec.shape)}")
    return tuple(given)


def _sized(where: str, flat: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    _concrete(where, shape)
    want = int(np.prod(shape, dtype=np.int64))
    if flat.size != want:
        raise InputDataError(f"{where}: {flat.size} elements for shape {list(shape)} ({want} elements)")
    return flat.reshape(shape)


def _bytes_from_wire(where: str, raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    try:
        return deserialize_bytes(raw, where, shape)
    except BytesTensorError as exc:
        raise InputDataError(
            f"{where}: b64 of a BYTES input is its elements each behind a 4-byte length ({exc})"
        ) from None


def _from_raw(where: str, spec: InputSpec, raw: bytes) -> np.ndarray:
    dtype = DATATYPE_TO_NUMPY[spec.datatype]
    if len(raw) % dtype.itemsize:
        raise InputDataError(f"{where}: {len(raw)} bytes is not a whole number of {spec.datatype} elements")
    if spec.datatype == "BF16":
        return np.frombuffer(raw, "<u2").view(dtype).copy()
    return np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype)


def _from_directory(folder: Path, specs: Sequence[InputSpec]) -> dict[str, np.ndarray]:
    tensors = {}
    for spec in specs:
        file = folder / spec.name
        where = str(file)
        if not file.is_file():
            raise InputDataError(f"{folder}: no file {spec.name!r} for input {spec.name!r}")
        raw = file.read_bytes()
        if spec.datatype == "BYTES":
            try:  # one element per line, as perf_analyzer reads them
                lines = raw.decode().split("\n")
                if lines and lines[-1] == "":
                    lines.pop()
            except UnicodeDecodeError as exc:
                raise InputDataError(f"{where}: a BYTES input's file holds UTF-8 lines ({exc})") from None
            tensors[spec.name] = _sized(
                where, np.array([s.encode() for s in lines], dtype=object), spec.shape
            )
        else:
            tensors[spec.name] = _sized(where, _from_raw(where, spec, raw), spec.shape)
    return tensors


def zero_data(specs: Sequence[InputSpec]) -> Mapping[str, float | str]:
    """perf_analyzer's ``--input-data zero``: every number 0, every string empty."""
    return {s.name: "" if s.datatype == "BYTES" else 0.0 for s in specs}
