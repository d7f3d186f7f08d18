"""Triton's optional inputs (``optional: true``): a request may leave one out, the engine is
called without it (ONNX Runtime: the graph's default, an initializer of that name; a Python
model: ``get_input_tensor_by_name`` is None), and a batch never mixes requests with and
without it (the batch key says which optional inputs are present)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from wattserve.batchers.queue import PriorityFifo
from wattserve.engines.config import EngineConfig
from wattserve.server.core.request import InferRequest
from wattserve.server.models.repository.config import ConfigError
from wattserve.server.models.repository.plan import plan_model
from wattserve.server.settings import Settings

from support.onnx_models import ADD_DEFAULT_B, optional_add_model
from tests.servers import free_port, threaded_server

TENSORS = """input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
          { name: "B" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
"""
ONNX_CONFIG = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n' + TENSORS
PYTHON_CONFIG = 'backend: "python"\nmax_batch_size: 8\n' + TENSORS
MODEL_PY = f"""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")
            y = a + (b.as_numpy() if b is not None else np.float32({ADD_DEFAULT_B}))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y.astype(np.float32))]))
        return out
"""


def write(root: Path, name: str, config: str, file: str, data: bytes) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    (root / name / "1" / file).write_bytes(data)
    return root / name


@pytest.fixture
def served(tmp_path):
    write(tmp_path, "add_onnx", ONNX_CONFIG, "model.onnx", optional_add_model())
    write(tmp_path, "add_python", PYTHON_CONFIG, "model.py", MODEL_PY.encode())
    port = free_port()
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False, grpc_port=port)) as (url, app):
        yield url, f"127.0.0.1:{port}", app


def over_http(url: str, model: str, a: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    inputs = [{"name": "A", "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()}]
    if b is not None:
        inputs.append({"name": "B", "shape": list(b.shape), "datatype": "FP32", "data": b.ravel().tolist()})
    r = httpx.post(f"{url}/v2/models/{model}/infer", json={"inputs": inputs}, timeout=30)
    assert r.status_code == 200, r.text
    return np.array(r.json()["outputs"][0]["data"], np.float32).reshape(a.shape)


def over_grpc(address: str, model: str, a: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    tensors = []
    for name, value in (("A", a), ("B", b)):
        if value is not None:
            tensor = tgrpc.InferInput(name, list(value.shape), "FP32")
            tensor.set_data_from_numpy(value)
            tensors.append(tensor)
    return tgrpc.InferenceServerClient(address).infer(model, tensors).as_numpy("Y")


@pytest.mark.parametrize("model", ["add_onnx", "add_python"])
def test_a_request_may_leave_an_optional_input_out_over_http_and_grpc(served, model):
    """Eight concurrent requests, half with B, over both protocols: each answered from its
    own inputs (with B: A + B; without: A + the default)."""
    url, address, _ = served
    rng = np.random.default_rng(0)
    cases = []
    for i in range(8):
        a = rng.standard_normal((1, 4)).astype(np.float32)
        b = rng.standard_normal((1, 4)).astype(np.float32) if i % 2 else None
        cases.append((over_http if i < 4 else over_grpc, a, b))
    with ThreadPoolExecutor(8) as pool:
        futures = [
            pool.submit(send, url if send is over_http else address, model, a, b) for send, a, b in cases
        ]
        results = [f.result() for f in futures]
    for (_, a, b), y in zip(cases, results, strict=True):
        np.testing.assert_allclose(y, a + (b if b is not None else ADD_DEFAULT_B), rtol=1e-6)
    config = httpx.get(f"{url}/v2/models/{model}/config").json()  # what runs, as Triton writes it
    assert [(t["name"], t.get("optional", False)) for t in config["input"]] == [("A", False), ("B", True)]
    missing_a = httpx.post(f"{url}/v2/models/{model}/infer", json={"inputs": [
        {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})  # fmt: skip
    assert missing_a.status_code == 400 and "missing input(s) ['A']" in missing_a.json()["error"]


def test_requests_with_and_without_an_optional_input_never_share_a_batch(served):
    _, _, app = served
    runtime = app.state.models.lookup("add_onnx").runtime

    def item(names: tuple[str, ...]):
        inputs = {n: np.ones((1, 4), np.float32) for n in names}
        return runtime.make_item(InferRequest(id=None, inputs=inputs, batched=True, rows=1))

    with_b, without_b, again = item(("A", "B")), item(("A",)), item(("A",))
    assert with_b.shape_key != without_b.shape_key and without_b.shape_key == again.shape_key
    queue = PriorityFifo(1)  # the batcher's kind of queue, outside the running batcher
    for it in (without_b, with_b, again):
        queue.push(it)
    assert queue.pop_batch(8) == [without_b]  # the run ends at the request with the other key
    assert queue.pop_batch(8) == [with_b]
    assert queue.pop_batch(8) == [again]


def test_an_optional_input_the_onnx_model_requires_fails_the_load(tmp_path):
    model = write(tmp_path, "m", ONNX_CONFIG, "model.onnx", optional_add_model(required_b=True))
    (plan,) = plan_model(model, Settings())
    with pytest.raises(Exception, match="'B' is optional in the config but the model requires it"):
        plan.engine_factory(EngineConfig(model="m", device="cpu", max_batch_size=8))


def test_optional_inputs_of_other_engines_are_refused_at_load(tmp_path):
    config = ONNX_CONFIG.replace('platform: "onnxruntime_onnx"', 'platform: "pytorch_libtorch"')
    model = write(tmp_path, "ts", config, "model.pt", b"")
    with pytest.raises(ConfigError, match=r"'input\[1\]\.optional' is not supported by wattserve"):
        plan_model(model, Settings())


PICK_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):  # OUTPUTn for each INPUTn present (Triton's optional_identity)
        out = []
        for request in requests:
            tensors = []
            for i in ("0", "1"):
                x = pb_utils.get_input_tensor_by_name(request, "INPUT" + i)
                if x is not None:
                    tensors.append(pb_utils.Tensor("OUTPUT" + i, x.as_numpy()))
            out.append(pb_utils.InferenceResponse(tensors))
        return out
"""
PICK_TENSORS = """max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
        { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
CHAIN = """platform: "ensemble"
{tensors}ensemble_scheduling {{ step [
  {{ model_name: "pick" model_version: -1 input_map {{ key: "INPUT0" value: "INPUT0" }}
     input_map {{ key: "INPUT1" value: "INPUT1" }} output_map {{ key: "OUTPUT0" value: "mid0" }}
     output_map {{ key: "OUTPUT1" value: "mid1" }} }},
  {{ model_name: "pick" model_version: -1 input_map {{ key: "{second0}" value: "mid0" }}
     input_map {{ key: "{second1}" value: "mid1" }} output_map {{ key: "OUTPUT0" value: "OUTPUT0" }}
     output_map {{ key: "OUTPUT1" value: "OUTPUT1" }} }} ] }}
"""
ADD_ENSEMBLE = """platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "add_onnx" model_version: -1 input_map { key: "A" value: "A" }
  input_map { key: "B" value: "B" } output_map { key: "Y" value: "Y" } } ] }
"""


@pytest.fixture
def ensembles(tmp_path):
    """Triton's L0_optional_input ensembles: optional ensemble inputs, a step input left
    unmapped, a connecting tensor its step did not produce."""
    write(tmp_path, "add_onnx", ONNX_CONFIG, "model.onnx", optional_add_model())
    write(tmp_path, "pick", 'backend: "python"\n' + PICK_TENSORS, "model.py", PICK_PY.encode())
    write(tmp_path, "add_ensemble", ADD_ENSEMBLE, ".keep", b"")
    chain = CHAIN.format(tensors=PICK_TENSORS, second0="INPUT0", second1="INPUT1")
    write(tmp_path, "chain", chain, ".keep", b"")
    # a step that maps only one of its model's optional inputs (pipeline_identity_2_float32's)
    half = (
        CHAIN.format(tensors=PICK_TENSORS, second0="INPUT1", second1="unused")
        .replace('input_map { key: "unused" value: "mid1" }', "")
        .replace('output_map { key: "OUTPUT1" value: "mid1" }', "")
    )
    write(tmp_path, "half", half, ".keep", b"")
    port = free_port()
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False, grpc_port=port)) as (url, _):
        yield url, f"127.0.0.1:{port}"


def test_an_ensemble_passes_optional_inputs_left_out_to_its_steps_over_http_and_grpc(ensembles):
    url, address = ensembles
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 2, np.float32)
    for send, where in ((over_http, url), (over_grpc, address)):
        np.testing.assert_allclose(send(where, "add_ensemble", a, b), a + b)
        np.testing.assert_allclose(send(where, "add_ensemble", a, None), a + ADD_DEFAULT_B)
    index = {m["name"]: m["state"] for m in httpx.post(url + "/v2/repository/index", json={}).json()}
    assert index["half"] == "READY", index  # a step's optional input left unmapped


def test_a_connecting_tensor_its_step_did_not_produce_is_an_absent_optional_input(ensembles):
    """Only INPUT0 sent: the first step answers OUTPUT0 alone (a Python model may leave a
    requested output out, as Triton's), so the second gets INPUT0 only; the answer has
    OUTPUT0 and no OUTPUT1, over HTTP and gRPC."""
    url, address = ensembles
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [3.5]}]}
    for model in ("chain", "pick"):
        answer = httpx.post(f"{url}/v2/models/{model}/infer", json=body)
        assert answer.status_code == 200, answer.text
        assert [(o["name"], o["data"]) for o in answer.json()["outputs"]] == [("OUTPUT0", [3.5])]
        x = tgrpc.InferInput("INPUT0", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[3.5]], np.float32))
        result = tgrpc.InferenceServerClient(address).infer(model, [x])
        assert result.as_numpy("OUTPUT0").tolist() == [[3.5]] and result.as_numpy("OUTPUT1") is None
    half = httpx.post(f"{url}/v2/models/half/infer", json=body).json()  # mid0 -> the second step's INPUT1
    assert [(o["name"], o["data"]) for o in half["outputs"]] == [("OUTPUT1", [3.5])]
