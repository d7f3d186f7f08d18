"""Triton Python backend models (``model.py``) served unchanged, seen through Triton's clients.

Where each behaviour comes from:
- the lifecycle (``initialize(args)`` with its keys, ``execute(requests)`` -> one response per
  request, ``finalize``), ``pb_utils`` (Tensor, get_input_tensor_by_name,
  get_output_config_by_name, triton_string_to_numpy, InferenceResponse, TritonError,
  TritonModelException) and ``auto_complete_config``: python_backend README, "Usage",
  "auto_complete_config", "Error Handling"; its examples/add_sub (max_batch_size 0).
- a string model (BYTES as object arrays of bytes): python_backend README "Input and output
  tensors"; Triton's qa/L0_string_io.
- decoupled models (``model_transaction_policy { decoupled: true }``, the response sender,
  ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``, answers over the gRPC stream, refused by unary
  ModelInfer): README "Decoupled mode", examples/decoupled (repeat); the stream's
  ``triton_final_response`` parameter: tritonclient ``enable_empty_final_response``.
- batching: execute gets every request of the batch the dynamic batcher formed (README:
  "execute ... a list of pb_utils.InferenceRequest"; docs/user_guide/model_configuration.md
  "Dynamic Batcher").
- BLS (``pb_utils.InferenceRequest(...).exec()``) reaches the same server's models, through
  their batcher: README "Business Logic Scripting".
- an exception in execute fails that batch's requests and the server goes on; a
  TritonError in a response fails that request alone with its code; an initialize that
  raises leaves the model not ready with the reason: README "Error Handling",
  qa/L0_backend_python (python_unittest, model_control).
"""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException
from wattserve.server.settings import Settings

from support.python_models import write_python_model
from tests.servers import free_port, threaded_server

BASE = {"telemetry": False, "warmup": False, "torch_threads": 1}


@pytest.fixture(scope="module", params=["process", "thread"])
def server(tmp_path_factory, request):
    """One server per Python model isolation mode: the same answers are expected of both."""
    repo = tmp_path_factory.mktemp("python_repo")
    for kind in ("add_sub", "identity", "string", "repeat", "failing", "broken_init", "autocomplete"):
        write_python_model(repo, kind)
    write_python_model(repo, "bls", callee="identity")
    with threaded_server(
        Settings(model_repository=repo, grpc_port=free_port(), python_model_isolation=request.param, **BASE)
    ) as (url, app):
        http = thttp.InferenceServerClient(url.removeprefix("http://"))
        grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{app.state.grpc.port}")
        yield url, app, http, grpc


def _input(module, name, value, datatype):
    tensor = module.InferInput(name, list(value.shape), datatype)
    tensor.set_data_from_numpy(value)
    return tensor


def test_add_sub_answers_both_protocols(server):
    _, _, http, grpc = server
    a, b = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    for client, module in ((http, thttp), (grpc, tgrpc)):
        result = client.infer(
            "add_sub", [_input(module, "INPUT0", a, "FP32"), _input(module, "INPUT1", b, "FP32")]
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert http.get_model_metadata("add_sub")["inputs"][0]["shape"] == [4]  # max_batch_size 0: no batch axis


def test_identity_and_only_requested_outputs(server):
    grpc = server[3]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = grpc.infer("identity", [_input(tgrpc, "INPUT0", x, "FP32")],
                        outputs=[tgrpc.InferRequestedOutput("OUTPUT0")])  # fmt: skip
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    assert result.as_numpy("BATCH") is None


def test_string_model_bytes_in_and_out(server):
    _, _, http, grpc = server
    words = np.array([[b"triton", b"wattserve", b""]], dtype=object)
    for client, module in ((http, thttp), (grpc, tgrpc)):
        result = client.infer("string", [_input(module, "INPUT0", words, "BYTES")])
        assert result.as_numpy("OUTPUT0").tolist() == [[b"TRITON", b"WATTSERVE", b""]]
        assert result.as_numpy("LENGTH").tolist() == [[6, 9, 0]]


def test_auto_complete_config_fills_the_config(server):
    _, _, http, _ = server
    config = http.get_model_config("autocomplete")
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("X", "TYPE_INT64", [2])]
    x = np.array([[1, 2], [3, 4]], dtype=np.int64)
    result = http.infer("autocomplete", [_input(thttp, "X", x, "INT64")])
    np.testing.assert_array_equal(result.as_numpy("Y"), x * 10)


def test_decoupled_repeat_streams_every_response_over_grpc(server):
    _, _, _, grpc = server
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        values = np.array([4, 2, 0, 7], dtype=np.int32)
        grpc.async_stream_infer("repeat", [_input(tgrpc, "IN", values, "INT32")], request_id="r1",
                                enable_empty_final_response=True)  # fmt: skip
        got, final = [], False
        while not final:
            result, error = answers.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            assert response.id == "r1"
            final = response.parameters["triton_final_response"].bool_param
            if not final:
                got.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
        assert got == [(int(v), i) for i, v in enumerate(values)]
        # a second request on the same stream, without the empty final response
        grpc.async_stream_infer("repeat", [_input(tgrpc, "IN", values[:2], "INT32")], request_id="r2")
        second = [answers.get(timeout=30) for _ in range(2)]
        assert [int(r.as_numpy("OUT")[0]) for r, _ in second] == [4, 2]
        assert answers.empty() or answers.get(timeout=1) is None
    finally:
        grpc.stop_stream()


def test_decoupled_model_refuses_unary_infer(server):
    _, _, http, grpc = server
    values = np.array([1], dtype=np.int32)
    with pytest.raises(InferenceServerException, match="decoupled"):
        grpc.infer("repeat", [_input(tgrpc, "IN", values, "INT32")])
    with pytest.raises(InferenceServerException, match="decoupled"):
        http.infer("repeat", [_input(thttp, "IN", values, "INT32")])


def test_dynamic_batcher_hands_execute_several_requests(server):
    url, _, _, _ = server
    host = url.removeprefix("http://")

    def one(i: int) -> tuple[int, bool]:
        client = thttp.InferenceServerClient(host)
        x = np.full((1, 3), i, dtype=np.float32)
        result = client.infer("identity", [_input(thttp, "INPUT0", x, "FP32")], request_id=f"ext-{i}")
        return int(result.as_numpy("BATCH")[0, 0]), bool((result.as_numpy("OUTPUT0") == x).all())

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(64)))
    assert all(own for _, own in answers), "a request got another request's output"
    assert max(batch for batch, _ in answers) > 1, "execute never saw more than one request"


def test_bls_calls_reach_the_callee_through_its_batcher(server):
    url, _, _, _ = server
    host = url.removeprefix("http://")

    def one(i: int) -> tuple[int, bool]:
        client = thttp.InferenceServerClient(host)
        x = np.full((1, 2), i, dtype=np.float32)
        model, rid = ("bls", str(i)) if i % 2 else ("identity", f"ext-{i}")
        result = client.infer(model, [_input(thttp, "INPUT0", x, "FP32")], request_id=rid)
        return int(result.as_numpy("KINDS")[0, 0]), bool((result.as_numpy("OUTPUT0") == x).all())

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(96)))
    assert all(own for _, own in answers)
    # KINDS 2: one execute call of the callee held a BLS call and an external request
    assert max(kinds for kinds, _ in answers) == 2, "BLS calls never batched with external requests"


def test_errors_fail_their_requests_and_the_server_goes_on(server):
    _, _, http, grpc = server

    def infer(client, module, value):
        return client.infer("failing", [_input(module, "INPUT0", np.array([[value]], np.float32), "FP32")])

    with pytest.raises(InferenceServerException, match="negative input, cannot go on") as raised:
        infer(http, thttp, -1.0)
    assert raised.value.status() == "500"
    with pytest.raises(InferenceServerException, match="negative input") as raised:
        infer(grpc, tgrpc, -1.0)
    assert raised.value.status() == "StatusCode.INTERNAL"
    with pytest.raises(InferenceServerException, match="zero is not a valid input") as raised:
        infer(http, thttp, 0.0)
    assert raised.value.status() == "400"  # TritonError.INVALID_ARG
    assert infer(http, thttp, 2.0).as_numpy("OUTPUT0").tolist() == [[4.0]]
    assert http.is_server_live() and http.is_model_ready("failing")


def test_initialize_raising_leaves_the_model_unavailable_with_the_reason(server):
    http = server[2]
    assert not http.is_model_ready("broken_init")
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index["broken_init"]["state"] == "UNAVAILABLE"
    assert "weights file missing: /nowhere/weights.bin" in index["broken_init"]["reason"]
    assert index["add_sub"]["state"] == "READY" and http.is_server_ready()
