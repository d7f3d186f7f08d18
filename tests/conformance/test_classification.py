"""Triton's classification extension, live, with Triton's own clients.

Behaviours and their references:

- an output requested with ``class_count=K`` (HTTP ``"parameters": {"classification": K}``,
  gRPC ``parameters["classification"].int64_param``) comes back as BYTES ``[batch, K]``
  (``[K]`` for a model with max_batch_size 0) of ``"value:index:label"``, largest first:
  Triton's docs/protocol/extension_classification.md; qa/common/infer_util.py
  (``infer_exact`` with ``output0_raw=False``: ``class_count=num_classes``, each string
  split on ":" into value, index and ``label<index>``), run by qa/L0_infer/infer_test.py;
- the value printed by ``std::to_string`` (``%f`` for floats), K clipped to the number of
  classes, labels from the output's ``label_filename``: Triton's src/classification.cc and
  src/http_server.cc;
- K must be a positive integer (gRPC: "invalid value for 'classification' parameter"), and
  BOOL/FP16/BF16/BYTES outputs are not classifiable ("class result not available for output
  due to unsupported type"): src/grpc/grpc_utils.cc, src/classification.cc.
"""

from __future__ import annotations

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

CLASSES = 10
LABELS = [f"label{i}" for i in range(CLASSES)]


def identity_model(elem: int, shape: list) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("INPUT0", elem, shape)]
    outputs = [helper.make_tensor_value_info("OUTPUT0", elem, shape)]
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17)])
    model.ir_version = 8
    return model


def add_model(root, name: str, elem: int, max_batch: int, labels: str | None) -> None:
    (root / name / "1").mkdir(parents=True)
    shape = [None, CLASSES] if max_batch else [CLASSES]
    onnx.save(identity_model(elem, shape), str(root / name / "1" / "model.onnx"))
    datatype = {TensorProto.FLOAT: "FP32", TensorProto.FLOAT16: "FP16", TensorProto.INT32: "INT32"}[elem]
    label = f' label_filename: "{labels}"' if labels else ""
    (root / name / "config.pbtxt").write_text(
        f'platform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_{datatype} dims: [ {CLASSES} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_{datatype} dims: [ {CLASSES} ]{label} }} ]\n'
    )
    if labels and labels != "missing.txt":
        (root / name / labels).write_text("\n".join(LABELS) + "\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("classes")
    add_model(root, "scores", TensorProto.FLOAT, 8, "labels.txt")
    add_model(root, "scores_nobatch", TensorProto.FLOAT, 0, "labels.txt")
    add_model(root, "counts", TensorProto.INT32, 8, None)
    add_model(root, "halves", TensorProto.FLOAT16, 8, None)
    add_model(root, "unlabelled", TensorProto.FLOAT, 8, "missing.txt")
    port = free_port()
    settings = Settings(model_repository=root, torch_threads=1, max_queue_delay_ms=0, grpc_port=port)
    with threaded_server(settings) as (url, _):
        yield url.removeprefix("http://"), f"127.0.0.1:{port}"


def scores(rows: int) -> np.ndarray:
    """Distinct values (no ties), so the order is fully determined."""
    rng = np.random.default_rng(rows)
    return np.stack([rng.permutation(CLASSES) for _ in range(rows)]).astype(np.float32) / 8


def expected(row: np.ndarray, k: int, labels: bool = True) -> list[str]:
    order = np.argsort(-row, kind="stable")[:k]
    return [f"{row[i]:f}:{i}" + (f":label{i}" if labels else "") for i in order]


def as_text(array: np.ndarray) -> list:
    return [as_text(a) if isinstance(a, np.ndarray) else (a.decode() if isinstance(a, bytes) else a)
            for a in array]  # fmt: skip


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_batched(server, binary):
    http_url, _ = server
    x = scores(3)
    tensor = thttp.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    out = thttp.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=3)
    result = thttp.InferenceServerClient(http_url).infer("scores", [tensor], outputs=[out])
    meta = result.get_output("OUTPUT0")
    assert meta["datatype"] == "BYTES" and meta["shape"] == [3, 3]
    assert as_text(result.as_numpy("OUTPUT0")) == [expected(r, 3) for r in x]


def test_grpc_batched_and_unbatched(server):
    _, grpc_url = server
    client = tgrpc.InferenceServerClient(grpc_url)
    x = scores(2)
    tensor = tgrpc.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = client.infer("scores", [tensor], outputs=[tgrpc.InferRequestedOutput("OUTPUT0", class_count=4)])
    assert result.get_output("OUTPUT0").datatype == "BYTES"
    assert as_text(result.as_numpy("OUTPUT0")) == [expected(r, 4) for r in x]

    one = scores(1)[0]
    tensor = tgrpc.InferInput("INPUT0", [CLASSES], "FP32")
    tensor.set_data_from_numpy(one)
    result = client.infer(
        "scores_nobatch", [tensor], outputs=[tgrpc.InferRequestedOutput("OUTPUT0", class_count=2)]
    )
    assert list(result.get_output("OUTPUT0").shape) == [2]
    assert as_text(result.as_numpy("OUTPUT0")) == expected(one, 2)


def test_integers_without_labels_and_k_past_the_classes(server):
    http_url, _ = server
    x = (scores(1) * 8).astype(np.int32)
    tensor = thttp.InferInput("INPUT0", list(x.shape), "INT32")
    tensor.set_data_from_numpy(x)
    out = thttp.InferRequestedOutput("OUTPUT0", class_count=50)
    result = thttp.InferenceServerClient(http_url).infer("counts", [tensor], outputs=[out])
    assert result.get_output("OUTPUT0")["shape"] == [1, CLASSES]
    order = np.argsort(-x[0], kind="stable")
    assert as_text(result.as_numpy("OUTPUT0")) == [[f"{x[0][i]}:{i}" for i in order]]


def test_raw_and_classified_outputs_side_by_side(server):
    """Only the output that asks for classes is classified; another request of the same
    output without the parameter gets the raw tensor."""
    http_url, _ = server
    x = scores(1)
    tensor = thttp.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = thttp.InferenceServerClient(http_url).infer("scores", [tensor])
    assert result.get_output("OUTPUT0")["datatype"] == "FP32"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def infer_json(http_url: str, model: str, datatype: str, classification) -> httpx.Response:
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1, CLASSES], "datatype": datatype, "data": [0] * CLASSES}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": classification}}],
    }
    return httpx.post(f"http://{http_url}/v2/models/{model}/infer", json=body)


@pytest.mark.parametrize("bad", [0, -2, 1.5, "3", True])
def test_k_must_be_a_positive_integer(server, bad):
    http_url, _ = server
    response = infer_json(http_url, "scores", "FP32", bad)
    assert response.status_code == 400 and "classification" in response.json()["error"]


def test_grpc_zero_classes_is_invalid_argument(server):
    _, grpc_url = server
    tensor = tgrpc.InferInput("INPUT0", [1, CLASSES], "FP32")
    tensor.set_data_from_numpy(scores(1))
    output = tgrpc.InferRequestedOutput("OUTPUT0")
    output._output.parameters["classification"].int64_param = 0  # class_count=0 is not sent
    with pytest.raises(InferenceServerException) as err:
        tgrpc.InferenceServerClient(grpc_url).infer("scores", [tensor], outputs=[output])
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_fp16_output_is_not_classifiable(server):
    http_url, _ = server
    response = infer_json(http_url, "halves", "FP16", 3)
    assert response.status_code == 400
    assert "class result not available for output due to unsupported type 'FP16'" in response.json()["error"]


def test_missing_label_file_fails_the_load_naming_it(server):
    http_url, _ = server
    index = {m["name"]: m for m in thttp.InferenceServerClient(http_url).get_model_repository_index()}
    assert index["unlabelled"]["state"] == "UNAVAILABLE"
    assert "missing.txt" in index["unlabelled"]["reason"]
