"""server.grpc.wire reads a ModelInferRequest's header from its bytes as protobuf does."""

from __future__ import annotations

import pytest
from tritonclient.grpc import service_pb2
from wattserve.server.grpc.wire import WireError, peek_request


def message() -> service_pb2.ModelInferRequest:
    m = service_pb2.ModelInferRequest(model_name="módel", model_version="3", id="req-1")
    m.parameters["priority"].int64_param = 2
    a = m.inputs.add(name="INPUT0", datatype="FP32", shape=[2, -1, 300])
    a.contents.fp32_contents.extend([1.5] * 600)
    m.inputs.add(name="INPUT1", datatype="BYTES", shape=[4])
    m.outputs.add(name="OUTPUT0").parameters["classification"].int64_param = 3
    m.raw_input_contents.extend([b"\0" * 10, b"abc"])
    return m


def test_header_matches_the_parsed_message():
    m = message()
    peek = peek_request(m.SerializeToString())
    assert (peek.model_name, peek.model_version, peek.id) == ("módel", "3", "req-1")
    assert [(i.name, i.datatype, i.shape) for i in peek.inputs] == [
        ("INPUT0", "FP32", [2, -1, 300]),
        ("INPUT1", "BYTES", [4]),
    ]
    assert peek.inputs[0].contents_bytes == len(m.inputs[0].contents.SerializeToString())
    assert peek.inputs[1].contents_bytes == 0
    assert peek.raw_bytes == 13


def test_decode_cost_weighs_typed_contents_by_datatype():
    peek = peek_request(message().SerializeToString())
    typed = peek.inputs[0].contents_bytes
    assert peek.decode_cost(1000) == 1000 + 2 * 13 + 3 * typed


def test_last_scalar_wins_as_in_protobuf():
    data = (
        service_pb2.ModelInferRequest(model_name="first").SerializeToString()
        + service_pb2.ModelInferRequest(model_name="second").SerializeToString()
    )
    assert peek_request(data).model_name == service_pb2.ModelInferRequest.FromString(data).model_name


@pytest.mark.parametrize("bad", [b"\x0a\x05ab", b"\x0b", b"\x80", b"\x0a\x02\xff\xfe"])
def test_malformed_bytes_are_a_wire_error(bad):
    with pytest.raises(WireError):
        peek_request(bad)


def test_empty_message_is_empty():
    peek = peek_request(b"")
    assert peek.model_name == "" and peek.inputs == [] and peek.raw_bytes == 0
