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
# a varint integer may be 1 wire byte for an 8-byte protobuf value and an 8-byte numpy one;
# a BYTES element may be 2 wire bytes (key, length) for a ~16-byte protobuf view and a
# ~40-byte Python bytes object plus its 8-byte pointer in the numpy object array.
TYPED_COST = {"FP32": 3, "FP64": 3, "BYTES": 32}
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
                peek.shape.append(_signed(value))  # type: ignore[arg-type]
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
