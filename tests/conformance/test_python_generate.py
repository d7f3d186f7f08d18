"""Python models' request parameters, Triton's generate extension (HTTP streaming), BLS
streams and the config's ``backend``, seen through real clients on loopback.

Where each behaviour comes from:
- ``request.parameters()``: a JSON string of the request's parameters (python_backend
  README, "Inference Request Parameters"); Triton's front ends keep sequence_id,
  sequence_start, sequence_end, priority, timeout, binary_data_output for themselves and
  refuse other keys starting ``triton_`` ("parameter keys starting with 'triton_' are reserved
  for Triton usage...": src/http_server.cc, src/grpc/infer_handler.cc); a value must be a
  string, an integer, a number or a boolean (``SetTritonParameterFromJsonParameter``).
- the generate extension: docs/protocol/extension_generate.md and qa/L0_http/
  generate_endpoint_test.py (inputs by name, other keys as parameters, ``id`` echoed only when
  non-empty, one element -> the value itself, ``text/event-stream; charset=utf-8`` with one
  ``data: {...}\\n\\n`` per response, errors before inference as JSON with their status, an
  error response in the stream as ``{"error": ...}``, "expected N inputs but got M",
  "input 'X' already exists in request", "attempt to access JSON non-string as string",
  /generate wanting exactly one response).
- BLS ``exec(decoupled=True)``: an iterator over the callee's responses, the final flag alone
  as an empty response (python_backend README "Business Logic Scripting", examples/
  bls_decoupled: "Check for the last empty response").
- the model configuration of a Python model: ``"backend": "python"`` with an empty
  ``platform`` (Triton's printed model configuration).
"""

from __future__ import annotations

import json
import time

import grpc as grpc_lib
import numpy as np
import pytest
import requests
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.grpc import service_pb2
from wattserve.server.settings import Settings

from support.python_models import write_python_model
from tests.servers import free_port, threaded_server

BASE = {"telemetry": False, "warmup": False, "torch_threads": 1}

# Echoes TEXT and answers its request's parameters() as PARAMS (both BYTES, batching model).
PARAMS_CONFIG = """
name: "params"
backend: "python"
max_batch_size: 4
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ 1 ] },
         { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
PARAMS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            params = np.array([[request.parameters().encode()]] * len(text), dtype=object)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("TEXT_OUT", text), pb_utils.Tensor("PARAMS", params)]))
        return responses
"""

# Decoupled: N responses OUT = 0..N-1 (DELAY s apart), then the final flag alone; with the
# request parameter "fail": true, an error response (final) after them instead.
COUNTDOWN_CONFIG = """
name: "countdown"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "DELAY" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
COUNTDOWN = """
import json
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            delay = float(pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()[0])
            fail = json.loads(request.parameters()).get("fail", False)
            threading.Thread(target=self.send, args=(request.get_response_sender(), n, delay, fail)).start()
        return None

    def send(self, sender, n, delay, fail):
        for i in range(n):
            time.sleep(delay)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
        if fail:
            error = pb_utils.TritonError("An Error Occurred")
            sender.send(pb_utils.InferenceResponse(error=error),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# BLS over a decoupled callee: sums countdown's OUT over its stream, counts responses (the
# empty final one included) and the empty ones.
BLS_STREAM_CONFIG = """
name: "bls_stream"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "EMPTY" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
BLS_STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="countdown",
                inputs=[pb_utils.get_input_tensor_by_name(request, "N"),
                        pb_utils.Tensor("DELAY", np.array([0.0], np.float32))],
                requested_output_names=["OUT"])
            total = count = empty = 0
            for answer in call.exec(decoupled=True):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                count += 1
                if len(answer.output_tensors()) == 0:
                    empty += 1
                    continue
                total += int(pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor(name, np.array([value], np.int32))
                for name, value in (("SUM", total), ("COUNT", count), ("EMPTY", empty))]))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("python_generate_repo")
    write_python_model(repo, "add_sub")
    for name, config, source in (
        ("params", PARAMS_CONFIG, PARAMS),
        ("countdown", COUNTDOWN_CONFIG, COUNTDOWN),
        ("bls_stream", BLS_STREAM_CONFIG, BLS_STREAM),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(source)
    with threaded_server(Settings(model_repository=repo, grpc_port=free_port(), **BASE)) as (url, app):
        http = thttp.InferenceServerClient(url.removeprefix("http://"))
        grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{app.state.grpc.port}")
        yield url, http, grpc


def _text_input(module):
    tensor = module.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"hi"]], dtype=object))
    return tensor


def _events(response: requests.Response) -> list[dict]:
    """The SSE body's events; every chunk must be ``data: <json>\\n\\n``."""
    body = response.content.decode()
    assert body.endswith("\n\n")
    chunks = body.split("\n\n")[:-1]
    assert all(chunk.startswith("data: ") for chunk in chunks), body
    return [json.loads(chunk.removeprefix("data: ")) for chunk in chunks]


# ---------------------------------------------------------------------------- parameters


def test_request_parameters_reach_the_model_over_http_and_grpc(server):
    _, http, grpc = server
    sent = {"temperature": 0.5, "top_k": 3, "greedy": True, "mode": "fast"}
    for client, module in ((http, thttp), (grpc, tgrpc)):
        result = client.infer("params", [_text_input(module)], parameters=sent, priority=1, timeout=10**7)
        assert result.as_numpy("TEXT_OUT").tolist() == [[b"hi"]]
        # priority and timeout are Triton's own: the model never sees them
        assert json.loads(result.as_numpy("PARAMS")[0][0]) == sent
    plain = http.infer("params", [_text_input(thttp)])
    assert json.loads(plain.as_numpy("PARAMS")[0][0]) == {}


def test_reserved_and_malformed_parameters_are_refused_with_tritons_words(server):
    url, _, grpc = server  # tritonclient refuses triton_* itself: raw requests show the server's answer
    body = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["hi"]}],
            "parameters": {"triton_secret": 1}}  # fmt: skip
    answer = requests.post(f"{url}/v2/models/params/infer", json=body, timeout=30)
    assert answer.status_code == 400 and "reserved for Triton usage" in answer.json()["error"]
    message = service_pb2.ModelInferRequest(model_name="params")
    tensor = message.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1])
    tensor.contents.bytes_contents.append(b"hi")
    message.parameters["triton_secret"].int64_param = 1
    with pytest.raises(grpc_lib.RpcError) as refused:
        grpc._client_stub.ModelInfer(message, timeout=30)
    assert refused.value.code() == grpc_lib.StatusCode.INVALID_ARGUMENT
    assert "reserved for Triton usage" in refused.value.details()
    body["parameters"] = {"nested": {"a": 1}}
    answer = requests.post(f"{url}/v2/models/params/infer", json=body, timeout=30)
    assert answer.status_code == 400
    assert "parameter 'nested' has invalid type" in answer.json()["error"]


# ---------------------------------------------------------------------------- generate


def test_generate_answers_one_json_object_with_outputs_by_name(server):
    url, _, _ = server
    answer = requests.post(f"{url}/v2/models/add_sub/generate", timeout=30,
                           json={"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1], "id": "42"})  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    doc = answer.json()
    assert doc["id"] == "42" and doc["model_name"] == "add_sub" and doc["model_version"] == "1"
    assert doc["OUTPUT0"] == [2, 3, 4, 5] and doc["OUTPUT1"] == [0, 1, 2, 3]
    # keys that are not inputs (top level or in "parameters") are the request's parameters;
    # one element comes back as the value itself; an empty id is not echoed
    answer = requests.post(f"{url}/v2/models/params/versions/1/generate", timeout=30,
                           json={"TEXT": "hi", "id": "", "temperature": 0, "parameters": {"mode": "x"}})  # fmt: skip
    doc = answer.json()
    assert "id" not in doc and doc["TEXT_OUT"] == "hi"
    assert json.loads(doc["PARAMS"]) == {"temperature": 0, "mode": "x"}


def test_generate_refusals_are_json_in_tritons_words(server):
    url, _, _ = server
    cases = [
        ({"INPUT0": [1, 2, 3, 4]}, "expected 2 inputs but got 1 inputs"),
        ({"TEXT": 5}, "attempt to access JSON non-string as string"),
        ('{"TEXT": "a", "TEXT": "b"}', "input 'TEXT' already exists in request"),
        ({"INPUT0": [1, 2, 3], "INPUT1": [1, 2, 3]}, "can not convert input 'INPUT0' to tensor"),
    ]
    for body, message in cases:
        model = "add_sub" if "INPUT0" in str(body) else "params"
        for route in ("generate", "generate_stream"):
            data = body if isinstance(body, str) else json.dumps(body)
            answer = requests.post(f"{url}/v2/models/{model}/{route}", data=data, timeout=30)
            assert answer.status_code == 400, (route, body, answer.text)
            assert answer.headers["content-type"] == "application/json"
            assert message in answer.json()["error"]
    missing = requests.post(f"{url}/v2/models/nowhere/generate_stream", json={}, timeout=30)
    assert missing.status_code == 404 and "error" in missing.json()


def test_generate_stream_sends_each_decoupled_response_as_it_comes(server):
    url, _, _ = server
    started = time.monotonic()
    arrivals = []
    with requests.post(f"{url}/v2/models/countdown/generate_stream", json={"N": 3, "DELAY": 0.3},
                       stream=True, timeout=30) as answer:  # fmt: skip
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
        events = []
        for line in answer.iter_lines():
            if line:
                arrivals.append(time.monotonic() - started)
                events.append(json.loads(line.removeprefix(b"data: ")))
    assert [e["OUT"] for e in events] == [0, 1, 2]
    assert all(e["model_name"] == "countdown" for e in events)
    assert arrivals[0] < arrivals[-1] - 0.4  # streamed, not gathered at the end
    # a model that is not decoupled answers one event
    answer = requests.post(f"{url}/v2/models/add_sub/generate_stream", timeout=30,
                           json={"INPUT0": [1, 2, 3, 4], "INPUT1": [0, 0, 0, 0]})  # fmt: skip
    assert [e["OUTPUT0"] for e in _events(answer)] == [[1, 2, 3, 4]]


def test_generate_stream_error_responses_and_generates_single_answer_rule(server):
    url, _, _ = server
    # an error after a response: status 200 (set by the first), the error as an event
    answer = requests.post(f"{url}/v2/models/countdown/generate_stream", timeout=30,
                           json={"N": 1, "DELAY": 0, "fail": True})  # fmt: skip
    assert answer.status_code == 200
    assert _events(answer)[1] == {"error": "An Error Occurred"} and _events(answer)[0]["OUT"] == 0
    # an error first: the status says so, the body is still the stream
    answer = requests.post(f"{url}/v2/models/countdown/generate_stream", timeout=30,
                           json={"N": 0, "DELAY": 0, "fail": True})  # fmt: skip
    assert answer.status_code == 500
    assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert _events(answer) == [{"error": "An Error Occurred"}]
    # /generate: exactly one response (the flag-only final one does not count)
    one = requests.post(f"{url}/v2/models/countdown/generate", json={"N": 1, "DELAY": 0}, timeout=30)
    assert one.status_code == 200 and one.json()["OUT"] == 0
    many = requests.post(f"{url}/v2/models/countdown/generate", json={"N": 2, "DELAY": 0}, timeout=30)
    assert many.status_code == 400 and "exactly 1 response" in many.json()["error"]


# ---------------------------------------------------------------------------- BLS, config


def test_bls_exec_decoupled_iterates_the_callees_stream(server):
    _, http, _ = server
    tensor = thttp.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([4], np.int32))
    result = http.infer("bls_stream", [tensor])
    # 0+1+2+3, four responses and the final flag as one empty response
    assert (result.as_numpy("SUM")[0], result.as_numpy("COUNT")[0], result.as_numpy("EMPTY")[0]) == (6, 5, 1)


def test_config_names_the_python_backend(server):
    _, http, grpc = server
    config = http.get_model_config("add_sub")
    assert config["backend"] == "python" and config["platform"] == ""
    assert grpc.get_model_config("add_sub").config.backend == "python"


def test_generate_routes_are_inference_for_access_control():
    from wattserve.server.security import api_of

    for route in ("generate", "generate_stream"):
        assert api_of(f"/v2/models/m/{route}") == "inference"
        assert api_of(f"/v2/models/m/versions/2/{route}") == "inference"
