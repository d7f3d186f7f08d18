"""The KServe v2 wire protocol against a live server on loopback, with the official
Triton client unmodified, plus our own JSON and binary paths."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as triton
from wattserve.server.settings import Settings

from tests.servers import threaded_server


@pytest.fixture(scope="module")
def identity_server():
    settings = Settings(model="identity", identity_elements=16, batcher="dynamic",
                        max_batch_size=8, max_queue_delay_ms=1)  # fmt: skip
    with threaded_server(settings) as (url, _app):
        yield url


def triton_client(url: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url.removeprefix("http://"))


def test_triton_client_reads_metadata(identity_server):
    client = triton_client(identity_server)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("identity")
    meta = client.get_server_metadata()
    assert meta["name"] == "wattserve"
    assert "binary_tensor_data" in meta["extensions"]
    model = client.get_model_metadata("identity")
    assert model["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}]
    assert model["outputs"][0]["name"] == "OUTPUT0"
    config = client.get_model_config("identity")
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    assert not client.is_model_ready("nope")


@pytest.mark.parametrize("binary", [True, False])
def test_triton_client_infers(identity_server, binary):
    client = triton_client(identity_server)
    data = np.arange(32, dtype=np.float32).reshape(2, 16)
    inp = triton.InferInput("INPUT0", [2, 16], "FP32")
    inp.set_data_from_numpy(data, binary_data=binary)
    out = triton.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer("identity", [inp], outputs=[out], request_id="r-1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    assert result.get_response()["id"] == "r-1"


def test_triton_client_default_outputs_and_priority_timeout(identity_server):
    client = triton_client(identity_server)
    data = np.full((1, 16), 3.5, dtype=np.float32)
    inp = triton.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(data)
    result = client.infer("identity", [inp], priority=1, timeout=5_000_000)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_response_headers_show_batching(identity_server):
    import httpx

    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}]}
    r = httpx.post(identity_server + "/v2/models/identity/versions/1/infer", json=body)
    assert r.status_code == 200
    assert r.json()["outputs"][0]["shape"] == [1, 16]  # the request's own batch axis, kept
    unbatched = httpx.post(identity_server + "/v2/models/identity/versions/1/infer",
                           json={"inputs": [{**body["inputs"][0], "shape": [16]}]})  # fmt: skip
    assert unbatched.status_code == 400  # Triton: a batching model's input needs its batch axis
    assert int(r.headers["x-batch-size"]) >= 1
    assert float(r.headers["x-queue-time-ms"]) >= 0
    assert float(r.headers["x-compute-time-ms"]) >= 0
    assert "x-energy-joules" not in r.headers  # nothing measured on this machine: nothing made up
