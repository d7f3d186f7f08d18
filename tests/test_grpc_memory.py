"""A request's memory is bounded by its size (issue 22): a large gRPC message with typed
BYTES contents is refused from its header, before protobuf parses it into objects.

RSS is a count, not a timing: before the fix, each 20 MiB message of 4 M BYTES elements sent
to an unknown model was parsed (~200 MiB of protobuf objects) and kept until the cyclic
collector ran (``benchmarks/grpc_memory.py`` measures the 50 MiB case)."""

from __future__ import annotations

import grpc
import psutil
import pytest
from tritonclient.grpc import service_pb2

from support.grpc_messages import METHOD, big_request
from tests.servers import free_port, server_process

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def server():
    port = free_port()
    env = {"WATTSERVE_MODEL": "identity", "WATTSERVE_GRPC_PORT": str(port), "WATTSERVE_TELEMETRY": "false",
           "WATTSERVE_MAX_INFLIGHT_BODY_BYTES": str(128 * MIB)}  # fmt: skip
    with server_process(env) as proc:
        options = [("grpc.max_send_message_length", -1)]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            yield proc, channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)


def call_code(call, payload: bytes) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call(payload, timeout=120)
    return err.value.code()


def test_unknown_model_refused_without_growing_rss(server):
    proc, call = server
    rss = psutil.Process(proc.pid)
    assert call_code(call, service_pb2.ModelInferRequest(model_name="nope").SerializeToString()) == (
        grpc.StatusCode.NOT_FOUND
    )
    before = rss.memory_info().rss
    payload = big_request("nope", 4_000_000, 3)
    assert len(payload) > 19 * MIB
    for _ in range(4):
        assert call_code(call, payload) == grpc.StatusCode.NOT_FOUND
    growth = rss.memory_info().rss - before
    assert growth < 200 * MIB, f"server RSS grew {growth / MIB:.0f} MiB"


def test_known_model_wrong_datatype_refused_from_the_header(server):
    _, call = server
    assert call_code(call, big_request("identity", 4_000_000, 3)) == grpc.StatusCode.INVALID_ARGUMENT


def test_decoding_past_the_budget_is_resource_exhausted(server):
    """A valid header whose typed contents would cost more to decode than the server's
    whole decode budget (128 MiB here): refused before parsing, naming raw contents."""
    _, call = server
    request = service_pb2.ModelInferRequest(model_name="identity")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    tensor.contents.fp32_contents.extend([0.0] * 12_000_000)  # 48 MB at 3x
    with pytest.raises(grpc.RpcError) as err:
        call(request.SerializeToString(), timeout=120)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "raw_input_contents" in err.value.details()


def test_a_request_is_held_in_the_body_budget_once(tmp_path):
    """The receive path holds a message's worst-case decoding cost until its answer; the
    decoder reserved the payload again on top, so a request that fits the budget alone was
    refused "too many request bodies". Raw FP32 costs 3x its bytes (wire + protobuf's copy +
    numpy's): a budget of 3.5x fits it once, not 4x."""
    from wattserve.server.settings import Settings

    from tests.servers import threaded_server

    elements = 1 << 18  # 1 MiB of FP32
    grpc_port = free_port()
    settings = Settings(model="identity", identity_elements=elements, telemetry=False, grpc_port=grpc_port,
                        max_inflight_body_bytes=int(3.5 * 4 * elements) + 4096)  # fmt: skip
    request = service_pb2.ModelInferRequest(model_name="identity")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    assert tensor.name == "INPUT0"
    request.raw_input_contents.append(bytes(4 * elements))
    with threaded_server(settings), grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        answer = service_pb2.ModelInferResponse.FromString(call(request.SerializeToString(), timeout=60))
    assert len(answer.raw_output_contents[0]) == 4 * elements
