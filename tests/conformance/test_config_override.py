"""A load with a config override (and model files), as Model Analyzer and tritonclient send it.

Where each behaviour comes from:
- ``load_model(name, config=<JSON ModelConfig>)`` replaces config.pbtxt for that load; a
  later load without a config keeps it; unload then load goes back to config.pbtxt; a load
  that fails says "load failed for model 'X'" (INVALID_ARG: HTTP 400):
  qa/L0_lifecycle/lifecycle_test.py test_config_override; tritonclient's load_model
  (HTTP ``parameters.config``, gRPC ``parameters["config"].string_param``).
- ``files={"file:1/model.onnx": ...}`` with a config: the files are the model directory (the
  name need not be in the repository); files without a config fail with "failed to load
  'X', failed to poll from model repository": test_file_override. A path that would leave
  the model directory is refused and writes nothing: test_file_override_security.
- Model Analyzer's use: each candidate's max_batch_size / dynamic_batching, seen in /config.
"""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException
from wattserve.server.settings import Settings

from tests.conformance.tiny_models import add_one_onnx, write_model
from tests.servers import free_port, threaded_server

BASE = {"torch_threads": 1, "telemetry": False, "warmup": False, "max_queue_delay_ms": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "m")
    # Triton's test model: its repository config cannot load (no such platform here), three
    # versions on disk; the override names a backend and version 2
    write_model(repo, "versions", config='platform: "tensorflow_savedmodel"\nmax_batch_size: 8\n',
                versions=(1, 2, 3))  # fmt: skip
    settings = Settings(model_repository=repo, grpc_port=free_port(), model_control_mode="explicit",
                        load_model=["m"], **BASE)  # fmt: skip
    with threaded_server(settings) as (url, app):
        yield (url, app, thttp.InferenceServerClient(url.removeprefix("http://")),
               tgrpc.InferenceServerClient(f"127.0.0.1:{app.state.grpc.port}"))  # fmt: skip


def infer(http: thttp.InferenceServerClient, model: str, version: str = "") -> None:
    x = np.ones((1, 4), np.float32)
    tensor = thttp.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(
        http.infer(model, [tensor], model_version=version).as_numpy("OUTPUT0"), x + 1
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_override_changes_batching_as_model_analyzer_does(server, protocol):
    _, _, http, grpc = server
    client = http if protocol == "http" else grpc
    assert http.get_model_config("m")["max_batch_size"] == 8
    override = {"platform": "onnxruntime_onnx", "max_batch_size": 2,
                "dynamic_batching": {"preferred_batch_size": [2], "max_queue_delay_microseconds": 300}}  # fmt: skip
    client.load_model("m", config=json.dumps(override))
    config = http.get_model_config("m")
    assert config["max_batch_size"] == 2
    assert config["dynamic_batching"]["preferred_batch_size"] == [2]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 300
    infer(http, "m")
    client.load_model("m")  # no config: the override stays (Triton keeps it)
    assert http.get_model_config("m")["max_batch_size"] == 2
    client.unload_model("m")
    client.load_model("m")  # after an unload, config.pbtxt again
    assert http.get_model_config("m")["max_batch_size"] == 8


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritons_config_override_flow(server, protocol):
    _, _, http, grpc = server
    client = http if protocol == "http" else grpc
    with pytest.raises(InferenceServerException, match="load failed for model 'versions'") as info:
        client.load_model("versions")
    assert info.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    client.load_model(
        "versions", config='{"backend":"onnxruntime","version_policy":{"specific":{"versions":[2]}}}'
    )
    assert [http.is_model_ready("versions", v) for v in "123"] == [False, True, False]
    infer(http, "versions", "2")
    client.unload_model("versions")
    assert not http.is_model_ready("versions", "2")


def test_a_bad_override_is_a_400_that_says_why(server):
    url, _, http, grpc = server
    r = httpx.post(url + "/v2/repository/models/m/load", json={"parameters": {"config": "{not json"}})
    assert r.status_code == 400 and "not a JSON ModelConfig" in r.json()["error"]
    r = httpx.post(
        url + "/v2/repository/models/m/load", json={"parameters": {"config": '{"max_batch_size": -3}'}}
    )
    assert r.status_code == 400 and "load failed for model 'm'" in r.json()["error"]
    with pytest.raises(InferenceServerException, match="no_such_field") as info:
        grpc.load_model("m", config='{"no_such_field": 1}')
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    http.load_model("m")  # a good load afterwards works
    assert http.is_model_ready("m")


def test_files_with_a_config_become_the_model_directory(server):
    url, _, http, grpc = server
    onnx_bytes = add_one_onnx()
    grpc.load_model("sent_grpc", config='{"backend":"onnxruntime","max_batch_size":4}',
                    files={"file:1/model.onnx": onnx_bytes})  # fmt: skip
    assert http.is_model_ready("sent_grpc", "1")
    infer(http, "sent_grpc")
    body = {"parameters": {"config": '{"backend":"onnxruntime"}',
                           "file:3/model.onnx": base64.b64encode(onnx_bytes).decode()}}  # fmt: skip
    r = httpx.post(url + "/v2/repository/models/sent_http/load", json=body)
    assert r.status_code == 200, r.text
    assert http.is_model_ready("sent_http", "3")
    assert http.get_model_config("sent_http")["max_batch_size"] == 4  # Triton's auto-complete
    http.unload_model("sent_grpc")
    assert not http.is_model_ready("sent_grpc")


def test_files_without_a_config_or_escaping_the_directory_are_refused(server, tmp_path):
    url, _, http, grpc = server
    with pytest.raises(InferenceServerException,
                       match="failed to load 'm', failed to poll from model repository"):  # fmt: skip
        grpc.load_model("m", files={"file:1/model.onnx": add_one_onnx()})
    assert http.is_model_ready("m")  # the loaded model is untouched
    victim = tmp_path / "victim.txt"
    for key in (f"file:../../../../../../../../{victim}", f"file:{victim}", "file:1/../../x"):
        body = {
            "parameters": {"config": '{"backend":"onnxruntime"}', key: base64.b64encode(b"owned").decode()}
        }
        r = httpx.post(url + "/v2/repository/models/evil/load", json=body)
        assert r.status_code == 400 and "inside the model directory" in r.json()["error"], r.text
    assert not victim.exists()
    r = httpx.post(url + "/v2/repository/models/evil/load",
                   json={"parameters": {"config": "{}", "file:1/model.onnx": "not base64!"}})  # fmt: skip
    assert r.status_code == 400 and "not valid base64" in r.json()["error"]
