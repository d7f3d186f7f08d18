"""Triton's request semantics and statuses, as Triton's own clients see them.

Each behaviour, and where Triton states it:
- whole-request batching: a request is never split; preferred sizes and max_queue_delay
  count rows of whole requests; a request larger than the largest preferred size runs at
  once (Triton's dynamic batcher, ``GetDynamicBatch``; docs/user_guide/batcher.md;
  qa/L0_batcher/batcher_test.py ``test_multi_batch_*``);
- variable dimensions (``dims: [-1]``) take any size, zero included, and only same-shape
  requests share a batch (docs/user_guide/model_configuration.md "Variable dimensions",
  qa/L0_infer_variable, qa/L0_infer_zero);
- BYTES (TYPE_STRING) tensors on HTTP JSON, the binary extension and gRPC
  (docs/protocol/extension_binary_data.md; qa/L0_string_io);
- statuses and messages clients match on: "Request for unknown model: 'M' is not found"
  (qa/L0_lifecycle), "output 'X' already exists in request", a batching model's input
  without its batch dimension refused, "This API is restricted, expecting header 'K'"
  (qa/L0_http/http_restricted_api_test.py), a queue timeout answered UNAVAILABLE "Request
  timeout expired" (qa/L0_batcher/queue_timeout_test.py, tested in tests/test_batchers.py
  and tests/test_server_errors.py);
- Triton's raw binary request (``Inference-Header-Content-Length: 0``: the body is the one
  input, its shape deduced; qa/L0_http/http_test.py ``test_raw_binary``, ``test_byte``,
  ``test_multi_inputs``, ``test_multi_variable_dimensions``) and its overflow checks
  (``test_buffer_size_overflow``);
- the statistics extension counts each request once in queue and in each of
  compute_input/infer/output (perf_analyzer stops with "Server side statistics compute
  counts must be the same" otherwise; docs/protocol/extension_statistics.md).
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException
from wattserve.loadgen.server_process import free_port
from wattserve.server.settings import Settings

from support.onnx_models import add_sub_model, identity_model
from tests.servers import threaded_server

PREFERRED = "dynamic_batching { preferred_batch_size: [ 2, 6 ] max_queue_delay_microseconds: 1500000 }\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    add_sub_model(root, "var_add", "FP32", [-1], 8, "dynamic_batching { }\n")
    identity_model(root, "strings", "BYTES", [-1], 8, "dynamic_batching { }\n")
    identity_model(root, "whole", "FP32", [16], 8, PREFERRED)
    identity_model(root, "unbatched", "INT32", [-1, -1], 0)
    identity_model(root, "raw_var", "FP32", [-1], 8)
    identity_model(root, "raw_str", "BYTES", [1], 8)
    grpc_port = free_port()
    settings = Settings(model_repository=root, telemetry=False, grpc_port=grpc_port,
                        restricted_api="model-repository:admin-key=secret")  # fmt: skip
    with threaded_server(settings) as (url, _app):
        http = httpclient.InferenceServerClient(url.removeprefix("http://"), concurrency=16)
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        yield url, http, grpc
        http.close()
        grpc.close()


def _inputs(module, names_arrays, binary=True):
    out = []
    for name, array in names_arrays:
        datatype = (
            "BYTES" if array.dtype == object else {np.float32: "FP32", np.int32: "INT32"}[array.dtype.type]
        )
        tensor = module.InferInput(name, list(array.shape), datatype)
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


# ---------------------------------------------------------------- variable dimensions


@pytest.mark.parametrize("shape", [[1, 3], [2, 5], [1, 0], [3, 1]])
def test_variable_dimensions_over_http_and_grpc(server, shape):
    _url, http, grpc = server
    rng = np.random.default_rng(len(shape) + shape[1])
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    for module, client, binary in (
        (httpclient, http, True),
        (httpclient, http, False),
        (grpcclient, grpc, True),
    ):
        result = client.infer("var_add", _inputs(module, [("INPUT0", a), ("INPUT1", b)], binary))
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
        assert list(result.as_numpy("OUTPUT0").shape) == shape


def test_mixed_shapes_under_concurrency_each_get_their_own_answer(server):
    """Requests of different shapes arrive together; each is batched only with its own
    shape and answered from its own input (invariants 1 and 2)."""
    _url, http, _grpc = server
    shapes = [[1, 3], [1, 5], [2, 3], [1, 7]] * 6
    pending = []
    for i, shape in enumerate(shapes):  # tritonclient's own concurrency (its greenlet pool)
        a = np.full(shape, float(i), np.float32)
        b = np.ones(shape, np.float32)
        pending.append(http.async_infer("var_add", _inputs(httpclient, [("INPUT0", a), ("INPUT1", b)])))
    for i, request in enumerate(pending):
        out = request.get_result().as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, np.full(shapes[i], i + 1.0, np.float32))


def test_shape_outside_the_config_is_refused(server):
    url, _http, _grpc = server
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]},
                       {"name": "INPUT1", "shape": [1, 2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}]}  # fmt: skip
    r = httpx.post(f"{url}/v2/models/var_add/infer", json=body)
    assert r.status_code == 400 and "unexpected shape for input 'INPUT0'" in r.json()["error"]


def test_non_batching_model_takes_its_own_variable_shape(server):
    _url, http, grpc = server
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        result = client.infer("unbatched", _inputs(module, [("INPUT0", x)]))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


# ---------------------------------------------------------------- BYTES


STRINGS = np.array([[b"hello", "wattserve \u00e9t\u00e9".encode(), b""], [b"a b", b"1234", b"\x00x"]],
                   dtype=object)  # fmt: skip


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_round_trip_over_http(server, binary):
    _url, http, _grpc = server
    strings = STRINGS if binary else STRINGS[:, :2]  # JSON carries text; "\x00x" is text too
    tensor = httpclient.InferInput("INPUT0", list(strings.shape), "BYTES")
    tensor.set_data_from_numpy(strings, binary_data=binary)
    output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = http.infer("strings", [tensor], outputs=[output])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == strings.shape
    as_bytes = [v if isinstance(v, bytes) else v.encode() for v in got.ravel()]
    assert as_bytes == list(strings.ravel())


def test_bytes_round_trip_over_grpc(server):
    _url, _http, grpc = server
    tensor = grpcclient.InferInput("INPUT0", list(STRINGS.shape), "BYTES")
    tensor.set_data_from_numpy(STRINGS)
    got = grpc.infer("strings", [tensor]).as_numpy("OUTPUT0")
    assert got.shape == STRINGS.shape and list(got.ravel()) == list(STRINGS.ravel())


def test_bytes_with_a_forged_length_is_a_400(server):
    url, _http, _grpc = server
    blob = (1000).to_bytes(4, "little") + b"abc"  # says 1000 bytes, has 3
    header = (
        b'{"inputs":[{"name":"INPUT0","shape":[1,1],"datatype":"BYTES","parameters":{"binary_data_size":%d}}]}'
        % len(blob)
    )
    r = httpx.post(f"{url}/v2/models/strings/infer", content=header + blob,
                   headers={"Inference-Header-Content-Length": str(len(header))})  # fmt: skip
    assert r.status_code == 400 and "runs past" in r.json()["error"]


# ---------------------------------------------------------------- whole requests


@pytest.mark.serial  # a wall-clock bound: elapsed < 1.5 s
def test_a_request_above_the_largest_preferred_size_runs_at_once_whole(server):
    """preferred [2, 6], delay 1.5 s: a [7, 16] request runs at once as one batch of 7."""
    url, _http, _grpc = server
    x = np.arange(7 * 16, dtype=np.float32).reshape(7, 16)
    body = {"inputs": [{"name": "INPUT0", "shape": [7, 16], "datatype": "FP32", "data": x.ravel().tolist()}]}
    started = time.monotonic()
    r = httpx.post(f"{url}/v2/models/whole/infer", json=body, timeout=30)
    elapsed = time.monotonic() - started
    assert r.status_code == 200, r.text
    assert r.headers["x-batch-size"] == "7"  # one batch, never split
    assert elapsed < 1.5  # not held for the delay (1.5 s)
    np.testing.assert_array_equal(np.array(r.json()["outputs"][0]["data"]).reshape(7, 16), x)


def test_a_request_between_preferred_sizes_runs_whole_after_the_delay(server):
    """preferred [2, 6]: a [3, 16] request cannot make a preferred size alone; it runs as
    one batch of 3 once the delay has passed (Triton's rule), not as 2 + 1."""
    url, _http, _grpc = server
    x = np.ones((3, 16), np.float32)
    body = {"inputs": [{"name": "INPUT0", "shape": [3, 16], "datatype": "FP32", "data": x.ravel().tolist()}]}
    started = time.monotonic()
    r = httpx.post(f"{url}/v2/models/whole/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-batch-size"] == "3"
    assert time.monotonic() - started >= 1.4  # it waited out the delay


def test_a_request_above_max_batch_size_is_refused(server):
    url, _http, _grpc = server
    body = {"inputs": [{"name": "INPUT0", "shape": [9, 16], "datatype": "FP32", "data": [0.0] * 144}]}
    r = httpx.post(f"{url}/v2/models/whole/infer", json=body)
    assert r.status_code == 400 and "batch-size must be <= 8" in r.json()["error"]


# ---------------------------------------------------------------- statuses and messages


def test_batching_model_input_without_batch_dimension_is_refused(server):
    url, _http, _grpc = server
    body = {"inputs": [{"name": "INPUT0", "shape": [16], "datatype": "FP32", "data": [0.0] * 16}]}
    r = httpx.post(f"{url}/v2/models/whole/infer", json=body)
    assert r.status_code == 400 and "expected [-1, 16], got [16]" in r.json()["error"]


def test_the_same_output_requested_twice_is_refused(server):
    _url, http, grpc = server
    x = np.zeros((1, 16), np.float32)
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT0")]
        with pytest.raises(InferenceServerException, match="output 'OUTPUT0' already exists in request"):
            client.infer("whole", _inputs(module, [("INPUT0", x)]), outputs=outputs)


def test_unknown_model_and_version_answer_in_tritons_words(server):
    url, http, grpc = server
    x = np.zeros((1, 16), np.float32)
    for module, client in ((httpclient, http), (grpcclient, grpc)):
        with pytest.raises(InferenceServerException) as unknown:
            client.infer("nope", _inputs(module, [("INPUT0", x)]))
        assert unknown.value.message() == "Request for unknown model: 'nope' is not found"
        with pytest.raises(InferenceServerException) as version:
            client.infer("whole", _inputs(module, [("INPUT0", x)]), model_version="9")
        assert version.value.message() == "Request for unknown model: 'whole' version 9 is not found"
    r = httpx.post(f"{url}/v2/models/nope/infer", json={})
    assert r.status_code == 404
    for served in ("var_add", "strings", "unbatched"):  # never a list of what else is served
        assert served not in r.text


def test_unknown_route_answers_in_the_servers_error_shape(server):
    url, _http, _grpc = server
    r = httpx.get(f"{url}/v2/no/such/route")
    assert r.status_code == 404
    assert set(r.json()) == {"error"}
    r = httpx.delete(f"{url}/v2/models/whole/infer")
    assert r.status_code == 405 and set(r.json()) == {"error"}


def test_restricted_api_message_is_tritons(server):
    url, _http, _grpc = server
    r = httpx.post(f"{url}/v2/repository/index", json={})
    assert r.status_code == 403
    assert r.json()["error"] == "This API is restricted, expecting header 'admin-key'"


# ---------------------------------------------------------------- statistics


def test_statistics_count_every_request_once_in_each_compute_phase(server):
    _url, http, grpc = server
    before = http.get_inference_statistics("whole")["model_stats"][0]
    x = np.ones((7, 16), np.float32)  # above the largest preferred size: runs at once
    for _ in range(3):
        http.infer("whole", _inputs(httpclient, [("INPUT0", x)]))
    stats = http.get_inference_statistics("whole")["model_stats"][0]
    inference = stats["inference_stats"]
    success = inference["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert success == 3
    counts = {
        phase: inference[phase]["count"]
        for phase in ("queue", "compute_input", "compute_infer", "compute_output")
    }
    assert len(set(counts.values())) == 1, counts  # what perf_analyzer checks
    assert stats["inference_count"] - before["inference_count"] == 21  # rows, as Triton counts
    seven = next(b for b in stats["batch_stats"] if b["batch_size"] == 7)
    assert (
        seven["compute_input"]["count"]
        == seven["compute_infer"]["count"]
        == seven["compute_output"]["count"]
        >= 3
    )
    grpc_stats = grpc.get_inference_statistics("whole", as_json=True)["model_stats"][0]["inference_stats"]
    assert int(grpc_stats["compute_output"]["count"]) == int(grpc_stats["compute_input"]["count"])


# ---------------------------------------------------------------- raw binary requests


def _raw(url: str, model: str, data: bytes) -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{model}/infer", content=data,
                      headers={"Inference-Header-Content-Length": "0"})  # fmt: skip


def test_raw_binary_request_deduces_the_shape_and_answers_in_binary(server):
    url, _http, _grpc = server
    for n in (8, 32):
        data = np.arange(n, dtype=np.float32).tobytes()
        r = _raw(url, "raw_var", data)
        assert r.status_code == 200, r.text
        header = int(r.headers["Inference-Header-Content-Length"])
        assert r.content[header:] == data
        assert json.loads(r.content[:header])["outputs"][0]["shape"] == [1, n]


def test_raw_binary_bytes_input_is_one_element(server):
    url, _http, _grpc = server
    r = _raw(url, "raw_str", b"427")
    assert r.status_code == 200, r.text
    header = int(r.headers["Inference-Header-Content-Length"])
    assert r.content[header:] == (3).to_bytes(4, "little") + b"427"  # Triton prepends the length


@pytest.mark.parametrize(
    ("model", "data", "message"),
    [
        ("var_add", np.arange(24, dtype=np.float32).tobytes(),
         "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in"),
        ("unbatched", np.ones(4, np.int32).tobytes(),
         "The shape of the raw input 'INPUT0' can not be deduced because there are more than one variable-sized dimension"),
        ("strings", b"427", "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"),
    ],
)  # fmt: skip
def test_raw_binary_requests_that_cannot_be_deduced_are_refused(server, model, data, message):
    url, _http, _grpc = server
    r = _raw(url, model, data)
    assert r.status_code == 400 and message in r.json()["error"]


def test_element_count_and_byte_size_overflow_are_refused_in_tritons_words(server):
    url, _http, _grpc = server
    for shape, message in (([2**4, 2**60 + 2], "causes total element count to exceed maximum size of"),
                           ([2**2, 2**60 + 2], "byte size overflow for input")):  # fmt: skip
        body = {"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": [1.0]}]}
        r = httpx.post(f"{url}/v2/models/raw_var/infer", json=body)
        assert r.status_code == 400 and message in r.json()["error"]
