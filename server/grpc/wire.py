"""A ModelInferRequest's header read straight from its wire bytes, before it is parsed.

Parsing a message into protobuf objects costs many times its size when it carries typed
``contents`` (10 M BYTES elements, 48 MiB on the wire, parse into ~470 MiB; decoding them
into Python objects costs more), so the gRPC front end reads only what it needs to refuse
a request first: the model name and version, each input's name, datatype and shape, and how
many bytes its contents take. Nested contents are skipped by their length, never walked,
so the cost is a loop over the message's top-level fields and each input's few fields.

The wire format is protobuf's: a key varint (field number << 3 | wire type) before each
field; length-delimited fields (type 2) carry a varint length. Field numbers are those of
Triton's grpc_service.proto (ModelInferRequest, InferInputTensor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_FIELDS = 65_536  # top-level fields one message may have (inputs, outputs, raw blobs, ...)
MAX_DIMS = 64

# ModelInferRequest
_MODEL_NAME, _MODEL_VERSION, _ID, _INPUTS, _RAW = 1, 2, 3, 5, 7
# InferInputTensor
_NAME, _DATATYPE, _SHAPE, _CONTENTS = 1, 2, 3, 5

# Decoding cost per wire byte of typed contents, at worst (the bound the body budget
# reserves): fixed-width floats are copied about twice (protobuf's array, numpy's);
# a varint integer may be 1 wire byte for an 8-byte protobuf value and an 8-byte numpy one.
#
# BYTES, measured (python -m benchmarks.bytes_decode_cost --elements 2097153: parse, then
# bytes_from_values' object array; peak RSS above the wire bytes; 2**k + 1 elements is the
# worst case of upb's doubling arrays, whose outgrown blocks stay in the message's arena):
#   peak = 1.85 * wire + 63.5 * elements + 43.4 * objects
# (per element: upb's 16-byte views as the array doubles, the list and the object array's
# pointers; objects: elements of 2+ bytes, whose Python bytes take a 48-byte block; b"" and
# 1-byte values are CPython's shared singletons). The element count is not known before
# parsing, but every element takes 2 wire bytes at least (key, length) and an object 4, so
# per wire byte the cost is at most 1.85 + max(63.5 / 2, (63.5 + 43.4) / 4) = 33.6 -> 34.
# Measured per wire byte at 2**21 + 1 elements: 32.1 (empty), 24.0 (1 byte), 30.1 (2 bytes),
# 20.1 (4), 12.0 (8), 8.0 (16), 5.2 (32). Triton's L0_grpc test_bytes_contents_many_elements_
# serialization (10 Mi elements of 1 byte, 30 MiB on the wire) peaks 656 MiB above its wire
# bytes (estimate: 1050 MiB), so the default 512 MiB budget refuses it honestly;
# WATTSERVE_MAX_INFLIGHT_BODY_BYTES=1342177280 (1.25 GiB) serves it (the front end also
# reserves payload_bytes, 50 MiB here, while it decodes).
TYPED_COST = {"FP32": 3, "FP64": 3, "BYTES": 34}
VARINT_COST = 16  # every other datatype's contents are varints


class WireError(ValueError):
    """Not a well-formed ModelInferRequest."""


@dataclass
class InputPeek:
    name: str = ""
    datatype: str = ""
    shape: list[int] = field(default_factory=list)
    contents_bytes: int = 0  # wire bytes of its typed contents (0: none)


@dataclass
class RequestPeek:
    model_name: str = ""
    model_version: str = ""
    id: str = ""
    inputs: list[InputPeek] = field(default_factory=list)
    raw_bytes: int = 0  # raw_input_contents, all blobs together

    def decode_cost(self, wire_bytes: int) -> int:
        """Bytes that parsing and decoding this message may hold at once, at worst: the
        wire bytes, the raw blobs twice (protobuf's copy, the bytes handed to numpy), and
        each input's typed contents at ``TYPED_COST`` per wire byte."""
        typed = sum(i.contents_bytes * TYPED_COST.get(i.datatype, VARINT_COST) for i in self.inputs)
        return wire_bytes + 2 * self.raw_bytes + typed


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise WireError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(data: memoryview, limit: int):
    """(field number, wire type, value) of each field: an int for varints, a memoryview for
    length-delimited fields (not copied), None for fixed-width ones."""
    pos, count = 0, 0
    while pos < len(data):
        count += 1
        if count > limit:
            raise WireError(f"more than {limit} fields")
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise WireError("a field runs past the end of the message")
            yield number, wire, data[pos : pos + length]
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > len(data):
                raise WireError("a field runs past the end of the message")
            yield number, wire, None
        else:
            raise WireError(f"wire type {wire} is not used by this protocol")


def _text(value: object) -> str:
    if not isinstance(value, memoryview):
        raise WireError("a string field has the wrong wire type")
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise WireError("a string field is not UTF-8") from None


def _input(data: memoryview) -> InputPeek:
    peek = InputPeek()
    for number, wire, value in _fields(data, MAX_FIELDS):
        if number == _NAME:
            peek.name = _text(value)
        elif number == _DATATYPE:
            peek.datatype = _text(value)
        elif number == _SHAPE:
            if wire == 0:  # unpacked: one dim per field
                peek.shape.append(_signed(value))
            elif isinstance(value, memoryview):  # packed: varints back to back
                pos = 0
                while pos < len(value):
                    dim, pos = _varint(value, pos)
                    peek.shape.append(_signed(dim))
            if len(peek.shape) > MAX_DIMS:
                raise WireError(f"input {peek.name!r} has more than {MAX_DIMS} dimensions")
        elif number == _CONTENTS and isinstance(value, memoryview):
            peek.contents_bytes += len(value)
    return peek


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value  # int64 on the wire


def peek_request(message: bytes) -> RequestPeek:
    """The header of a serialized ModelInferRequest (WireError if malformed). Repeated
    scalar fields keep the last value, as protobuf's parser does."""
    data = memoryview(message)
    peek = RequestPeek()
    for number, _, value in _fields(data, MAX_FIELDS):
        if number == _MODEL_NAME:
            peek.model_name = _text(value)
        elif number == _MODEL_VERSION:
            peek.model_version = _text(value)
        elif number == _ID:
            peek.id = _text(value)
        elif number == _INPUTS and isinstance(value, memoryview):
            peek.inputs.append(_input(value))
        elif number == _RAW and isinstance(value, memoryview):
            peek.raw_bytes += len(value)
    return peek
