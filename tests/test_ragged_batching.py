"""Triton's ragged batching (``allow_ragged_batch``, ``batch_input``): requests of different
lengths share one batch, the model gets the ragged input's elements concatenated into one
1-dimensional tensor and the layout in batch inputs of every kind Triton defines, and each
request is answered from its own elements (its own row of every output)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from onnx import TensorProto, helper
from wattserve.batchers.queue import PriorityFifo
from wattserve.engines.config import EngineConfig
from wattserve.engines.ragged import batch_input_value
from wattserve.server.core.request import InferRequest
from wattserve.server.models.repository.config import ConfigError
from wattserve.server.models.repository.plan import plan_model
from wattserve.server.settings import Settings

from support.onnx_models import graph_model
from tests.servers import free_port, threaded_server

# every kind, each from INPUT; the model answers with each (one row per request) and the sum
# of each request's own elements, found through the accumulated counts
BATCH_INPUTS = [
    ("COUNT", "BATCH_ELEMENT_COUNT"),
    ("END", "BATCH_ACCUMULATED_ELEMENT_COUNT"),
    ("STARTS", "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"),
    ("MAX", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"),
    ("SHAPE", "BATCH_ITEM_SHAPE"),
    ("FLAT", "BATCH_ITEM_SHAPE_FLATTEN"),
]
OUTPUTS = ["SUM", "COUNT_OUT", "END_OUT", "START_OUT", "MAX_OUT", "SHAPE_OUT", "FLAT_OUT"]
CONFIG = (
    'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]\n'
    + "batch_input [ "
    + ", ".join(
        f'{{ kind: {kind} target_name: "{target}" data_type: TYPE_INT32 source_input: "INPUT" }}'
        for target, kind in BATCH_INPUTS
    )
    + " ]\noutput [ "
    + ", ".join(
        f'{{ name: "{name}" data_type: {"TYPE_FP32" if name == "SUM" else "TYPE_INT32"} dims: [ 1 ] }}'
        for name in OUTPUTS
    )
    + " ]\ndynamic_batching { max_queue_delay_microseconds: 1000000 }\n"
)
PLAIN_CONFIG = """platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000000 }
"""


def ragged_model() -> bytes:
    """SUM[i] = INPUT[starts[i]:end[i]].sum(), through a cumulative sum; every batch input
    returned as one int32 row per request."""
    h = helper
    i32 = TensorProto.INT32
    nodes = [
        h.make_node("Constant", [], ["zero"], value=h.make_tensor("z", TensorProto.FLOAT, [1], [0.0])),
        h.make_node("Constant", [], ["axis0"], value=h.make_tensor("a", TensorProto.INT64, [], [0])),
        h.make_node("Constant", [], ["one"], value=h.make_tensor("o", TensorProto.INT64, [1], [1])),
        h.make_node("Constant", [], ["s0"], value=h.make_tensor("s0v", TensorProto.INT64, [1], [0])),
        h.make_node("Constant", [], ["sm1"], value=h.make_tensor("sm1v", TensorProto.INT64, [1], [-1])),
        h.make_node("Constant", [], ["col"], value=h.make_tensor("c", TensorProto.INT64, [2], [-1, 1])),
        h.make_node("Concat", ["zero", "INPUT"], ["padded"], axis=0),
        h.make_node("CumSum", ["padded", "axis0"], ["cum"]),
        h.make_node("Slice", ["STARTS", "s0", "sm1"], ["starts"]),
        h.make_node("Cast", ["END"], ["end64"], to=TensorProto.INT64),
        h.make_node("Cast", ["starts"], ["start64"], to=TensorProto.INT64),
        h.make_node("Gather", ["cum", "end64"], ["hi"]),
        h.make_node("Gather", ["cum", "start64"], ["lo"]),
        h.make_node("Sub", ["hi", "lo"], ["sum"]),
        h.make_node("Reshape", ["sum", "col"], ["SUM"]),
        h.make_node("Reshape", ["COUNT", "col"], ["COUNT_OUT"]),
        h.make_node("Reshape", ["END", "col"], ["END_OUT"]),
        h.make_node("Reshape", ["starts", "col"], ["START_OUT"]),
        h.make_node("Shape", ["MAX"], ["max64"]),
        h.make_node("Cast", ["max64"], ["max32"], to=i32),
        h.make_node("Shape", ["COUNT"], ["b"]),
        h.make_node("Concat", ["b", "one"], ["b1"], axis=0),
        h.make_node("Expand", ["max32", "b1"], ["MAX_OUT"]),
        h.make_node("Identity", ["SHAPE"], ["SHAPE_OUT"]),
        h.make_node("Reshape", ["FLAT", "col"], ["FLAT_OUT"]),
    ]
    inputs = [h.make_tensor_value_info("INPUT", TensorProto.FLOAT, [None])]
    for target, _ in BATCH_INPUTS:
        shape = [None, None] if target == "SHAPE" else [None]
        inputs.append(h.make_tensor_value_info(target, i32 if target != "MAX" else TensorProto.INT32, shape))
    outputs = [h.make_tensor_value_info("SUM", TensorProto.FLOAT, [None, 1])]
    outputs += [h.make_tensor_value_info(n, i32, [None, 1]) for n in OUTPUTS[1:]]
    return graph_model(nodes, inputs, outputs, "ragged").SerializeToString()


def plain_model() -> bytes:
    """SUM = INPUT.sum(axis 1): batched by rows, so only same-length requests batch."""
    h = helper
    nodes = [
        h.make_node("Constant", [], ["ax"], value=h.make_tensor("a", TensorProto.INT64, [1], [1])),
        h.make_node("ReduceSum", ["INPUT", "ax"], ["SUM"], keepdims=1),
    ]
    inputs = [h.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", None])]
    outputs = [h.make_tensor_value_info("SUM", TensorProto.FLOAT, ["batch", 1])]
    return graph_model(nodes, inputs, outputs, "plain").SerializeToString()


PYTHON_CONFIG = """backend: "python"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "END" data_type: TYPE_INT32
                source_input: "INPUT" } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "END_LAST" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000000 }
"""
# each request's own sum; the batch input reaches the first request of each batch only (Triton's
# Python backend passes none: wattserve's addition), which answers with the batch's total
# element count, the others with -1
MODEL_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            end = pb_utils.get_input_tensor_by_name(request, "END")
            last = end.as_numpy()[-1] if end is not None else -1
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", x.sum(axis=1, keepdims=True).astype(np.float32)),
                pb_utils.Tensor("END_LAST", np.array([[last]], np.int32))]))
        return out
"""


TORCH_CONFIG = """platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS__1"
                data_type: TYPE_INT64 source_input: "INPUT__0" } ]
output [ { name: "SUM__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000000 }
"""


def torchscript_model() -> bytes:
    """SUM[i] = the sum of request i's elements, from the offsets (with zero) batch input."""
    import io

    import torch

    class SegmentSum(torch.nn.Module):
        def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
            cum = torch.cat([torch.zeros(1, dtype=x.dtype), torch.cumsum(x, 0)])
            return (cum[offsets[1:]] - cum[offsets[:-1]]).unsqueeze(1)

    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(SegmentSum()), buffer)
    return buffer.getvalue()


def write(root: Path, name: str, config: str, data: bytes) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(config)
    file = (
        "model.py" if b"TritonPythonModel" in data else "model.pt" if "libtorch" in config else "model.onnx"
    )
    (root / name / "1" / file).write_bytes(data)
    return root / name


@pytest.fixture
def served(tmp_path):
    write(tmp_path, "ragged", CONFIG, ragged_model())
    write(tmp_path, "plain", PLAIN_CONFIG, plain_model())
    write(tmp_path, "ragged_python", PYTHON_CONFIG, MODEL_PY.encode())
    write(tmp_path, "ragged_torch", TORCH_CONFIG, torchscript_model())
    port = free_port()
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False, grpc_port=port)) as (url, app):
        yield url, f"127.0.0.1:{port}", app


def over_http(url: str, x: np.ndarray) -> tuple[dict[str, np.ndarray], int]:
    body = {
        "inputs": [{"name": "INPUT", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]
    }
    r = httpx.post(f"{url}/v2/models/ragged/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    return outputs, int(r.headers["x-batch-size"])


def over_grpc(address: str, x: np.ndarray) -> tuple[dict[str, np.ndarray], int]:
    tensor = tgrpc.InferInput("INPUT", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    result = tgrpc.InferenceServerClient(address).infer("ragged", [tensor])
    return {name: result.as_numpy(name) for name in OUTPUTS}, 0


def test_requests_of_different_lengths_share_a_batch_each_answered_from_its_own_elements(served):
    """Six concurrent requests of lengths 1..6 (three over HTTP, three over gRPC) within one
    queue delay: they ride in batches larger than one, and each request's row of every
    output is its own sum and Triton's batch-input values for the batch it rode in."""
    url, address, _ = served
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((1, n)).astype(np.float32) for n in range(1, 7)]
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(over_http if i % 2 == 0 else over_grpc, url if i % 2 == 0 else address, x)
                   for i, x in enumerate(xs)]  # fmt: skip
        answers = [f.result() for f in futures]
    for x, (out, _) in zip(xs, answers, strict=True):
        n = x.shape[1]
        assert out["SUM"].shape == (1, 1)
        np.testing.assert_allclose(out["SUM"][0, 0], x.sum(), rtol=1e-5, atol=1e-5)
        assert out["COUNT_OUT"][0, 0] == n  # BATCH_ELEMENT_COUNT
        end, start = int(out["END_OUT"][0, 0]), int(out["START_OUT"][0, 0])
        assert end - start == n  # accumulated: where its elements end; with zero: where they start
        assert out["SHAPE_OUT"][0, 0] == n and out["FLAT_OUT"][0, 0] == n  # its item shape [n]
        assert out["MAX_OUT"][0, 0] >= n  # the batch's largest element count
    sizes = [size for _, size in answers if size]
    assert max(sizes) > 1, sizes  # lengths 1, 3, 5 over HTTP: some shared a batch
    stats = httpx.get(f"{url}/v2/models/ragged/stats").json()["model_stats"][0]
    assert stats["inference_count"] == 6 and stats["execution_count"] < 6


def test_each_batch_input_kind_has_tritons_value():
    shapes = [(3,), (4,), (1,)]
    i32 = np.dtype(np.int32)
    assert batch_input_value("BATCH_ELEMENT_COUNT", shapes, i32).tolist() == [3, 4, 1]
    assert batch_input_value("BATCH_ACCUMULATED_ELEMENT_COUNT", shapes, i32).tolist() == [3, 7, 8]
    assert batch_input_value("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", shapes, i32).tolist() == [
        0,
        3,
        7,
        8,
    ]
    assert batch_input_value("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", shapes, i32).shape == (4,)
    assert batch_input_value("BATCH_ITEM_SHAPE", shapes, i32).tolist() == [[3], [4], [1]]
    assert batch_input_value("BATCH_ITEM_SHAPE_FLATTEN", shapes, i32).tolist() == [3, 4, 1]
    two_d = [(2, 3), (1, 5)]
    assert batch_input_value("BATCH_ELEMENT_COUNT", two_d, i32).tolist() == [6, 5]
    assert batch_input_value("BATCH_ITEM_SHAPE", two_d, i32).tolist() == [[2, 3], [1, 5]]
    assert batch_input_value("BATCH_ITEM_SHAPE_FLATTEN", two_d, i32).tolist() == [2, 3, 1, 5]
    assert batch_input_value("BATCH_ELEMENT_COUNT", shapes, np.dtype(np.float32)).dtype == np.float32


def test_one_batch_of_mixed_lengths_is_concatenated_and_split_back(served):
    """The engine's own batch: INPUT 1-dimensional, the batch inputs for exactly these
    requests, and each request's answer its own row."""
    _, _, app = served
    runtime = app.state.models.lookup("ragged").runtime
    xs = [np.arange(n, dtype=np.float32)[np.newaxis] + n for n in (2, 5, 1)]
    items = [runtime.make_item(InferRequest(id=None, inputs={"INPUT": x}, batched=True, rows=1)) for x in xs]
    assert len({it.shape_key for it in items}) == 1  # lengths key no batch
    batch = runtime.engine.stack_items([it.inputs for it in items])
    assert batch["INPUT"].shape == (8,) and batch["INPUT"].tolist() == np.concatenate(xs, axis=1)[0].tolist()
    assert batch["COUNT"].tolist() == [2, 5, 1] and batch["END"].tolist() == [2, 7, 8]
    assert batch["STARTS"].tolist() == [0, 2, 7, 8] and batch["MAX"].shape == (5,)
    assert batch["SHAPE"].tolist() == [[2], [5], [1]] and batch["FLAT"].tolist() == [2, 5, 1]
    out = runtime.engine.infer(batch)
    assert out["SUM"][:, 0].tolist() == pytest.approx([x.sum() for x in xs])
    assert out["MAX_OUT"][:, 0].tolist() == [5, 5, 5]


def test_a_model_without_allow_ragged_batch_keeps_shapes_apart(served):
    url, _, app = served
    runtime = app.state.models.lookup("plain").runtime

    def item(n: int):
        return runtime.make_item(InferRequest(id=None, inputs={"INPUT": np.ones((1, n), np.float32)},
                                              batched=True, rows=1))  # fmt: skip

    two, three, two_again = item(2), item(3), item(2)
    assert two.shape_key != three.shape_key and two.shape_key == two_again.shape_key
    queue = PriorityFifo(1)
    for it in (two, three, two_again):
        queue.push(it)
    assert queue.pop_batch(8) == [two]
    r = httpx.post(f"{url}/v2/models/plain/infer", json={"inputs": [
        {"name": "INPUT", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]})  # fmt: skip
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [6.0]


def test_a_ragged_request_carries_one_batch_element(served):
    url, _, _ = served
    r = httpx.post(f"{url}/v2/models/ragged/infer", json={"inputs": [
        {"name": "INPUT", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3, 4]}]})  # fmt: skip
    assert r.status_code == 400 and "one batch element" in r.json()["error"]


def refused(tmp_path: Path, config: str, data: bytes = b"") -> str:
    model = write(tmp_path, "m", config, data or ragged_model())
    with pytest.raises(ConfigError) as err:
        plan_model(model, Settings())
    return str(err.value)


def test_malformed_batch_inputs_are_refused_at_load(tmp_path):
    unknown = CONFIG.replace('kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_INT32 '
                             'source_input: "INPUT"', 'kind: BATCH_ELEMENT_COUNT target_name: "COUNT" '
                             'data_type: TYPE_INT32 source_input: "NOPE"')  # fmt: skip
    assert "batch_input[0] (BATCH_ELEMENT_COUNT): source_input 'NOPE' is not an input of the model" in (
        refused(tmp_path / "a", unknown))  # fmt: skip
    kind = CONFIG.replace("kind: BATCH_ELEMENT_COUNT", "kind: BATCH_ELEMENT_COUNTS")
    assert "BATCH_ELEMENT_COUNTS" in refused(tmp_path / "b", kind)  # protobuf's own words, at load
    dtype = CONFIG.replace(
        'target_name: "COUNT" data_type: TYPE_INT32', 'target_name: "COUNT" data_type: TYPE_STRING'
    )
    assert "data_type TYPE_STRING; a batch input is" in refused(tmp_path / "c", dtype)
    clash = CONFIG.replace('target_name: "COUNT"', 'target_name: "INPUT"')
    assert "target_name 'INPUT' is already an input" in refused(tmp_path / "d", clash)
    reshaped = CONFIG.replace("dims: [ -1 ] allow_ragged_batch: true", "dims: [ -1 ] reshape { shape: [ -1 ] } "
                              "allow_ragged_batch: true")  # fmt: skip
    assert "'reshape' of ['INPUT'] with ragged batching is not supported" in refused(tmp_path / "g", reshaped)
    unbatched = CONFIG.replace("max_batch_size: 8", "max_batch_size: 0")
    assert "needs max_batch_size > 0" in refused(tmp_path / "e", unbatched)
    tensorrt = CONFIG.replace('platform: "onnxruntime_onnx"', 'platform: "tensorrt_plan"')
    text = refused(tmp_path / "f", tensorrt)
    assert (
        "'input[0].allow_ragged_batch' is not supported by wattserve (ragged batching is implemented for "
        "ONNX Runtime, TorchScript and Python models only)"
        in text
        and "'batch_input' is not supported" in text
    )


def test_a_model_file_without_the_batch_input_targets_fails_the_load(tmp_path):
    model = write(tmp_path, "m", CONFIG, plain_model())
    (plan,) = plan_model(model, Settings())
    with pytest.raises(Exception, match="the model's inputs are"):
        plan.engine_factory(EngineConfig(model="m", device="cpu", max_batch_size=8))
    wrong = CONFIG.replace(
        'target_name: "END" data_type: TYPE_INT32', 'target_name: "END" data_type: TYPE_INT64'
    )
    (plan,) = plan_model(write(tmp_path / "b", "m", wrong, ragged_model()), Settings())
    mismatch = "batch_input 'END' .* is TYPE_INT64 in the config but TYPE_INT32 in the model"
    with pytest.raises(Exception, match=mismatch):
        plan.engine_factory(EngineConfig(model="m", device="cpu", max_batch_size=8))


def test_a_python_model_gets_requests_of_different_lengths_together_and_the_batch_inputs_first(served):
    url, address, _ = served
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((1, n)).astype(np.float32) for n in range(1, 7)]

    def send(i: int, x: np.ndarray) -> tuple[float, int]:
        if i % 2:
            tensor = tgrpc.InferInput("INPUT", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            result = tgrpc.InferenceServerClient(address).infer("ragged_python", [tensor])
            return float(result.as_numpy("SUM")[0, 0]), int(result.as_numpy("END_LAST")[0, 0])
        body = {"inputs": [{"name": "INPUT", "shape": list(x.shape), "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
        r = httpx.post(f"{url}/v2/models/ragged_python/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        out = {o["name"]: o["data"][0] for o in r.json()["outputs"]}
        return float(out["SUM"]), int(out["END_LAST"])

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(send, range(6), xs))
    for x, (total, _) in zip(xs, answers, strict=True):
        assert total == pytest.approx(float(x.sum()), abs=1e-5)
    firsts = [(x.shape[1], last) for x, (_, last) in zip(xs, answers, strict=True) if last != -1]
    stats = httpx.get(f"{url}/v2/models/ragged_python/stats").json()["model_stats"][0]
    assert len(firsts) == stats["execution_count"] < 6  # one first request per batch; some shared
    assert sum(last for _, last in firsts) == sum(x.shape[1] for x in xs)  # every element counted once


def test_a_torchscript_model_sums_each_request_of_a_ragged_batch(served):
    url, address, _ = served
    xs = [np.arange(n, dtype=np.float32)[np.newaxis] * (n + 1) for n in (4, 1, 3, 2)]

    def send(i: int, x: np.ndarray) -> tuple[float, int]:
        if i % 2:
            tensor = tgrpc.InferInput("INPUT__0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            return float(
                tgrpc.InferenceServerClient(address).infer("ragged_torch", [tensor]).as_numpy("SUM__0")[0, 0]
            ), 0
        body = {"inputs": [{"name": "INPUT__0", "shape": list(x.shape), "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
        r = httpx.post(f"{url}/v2/models/ragged_torch/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return float(r.json()["outputs"][0]["data"][0]), int(r.headers["x-batch-size"])

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, range(4), xs))
    for x, (total, _) in zip(xs, answers, strict=True):
        assert total == pytest.approx(float(x.sum()))
    stats = httpx.get(f"{url}/v2/models/ragged_torch/stats").json()["model_stats"][0]
    assert stats["inference_count"] == 4 and stats["execution_count"] < 4


def test_model_warmup_samples_run_as_a_ragged_batch(tmp_path):
    """A config's warm-up sample (batch_size rows of one shape) reaches the model formed as a
    ragged batch, its batch inputs computed, before the model is READY."""
    warm = CONFIG + ('model_warmup [ { name: "w" batch_size: 3 inputs { key: "INPUT" value: '
                     '{ data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]\n')  # fmt: skip
    model = write(tmp_path, "m", warm, ragged_model())
    (plan,) = plan_model(model, Settings())
    engine = plan.engine_factory(EngineConfig(model="m", device="cpu", max_batch_size=8))
    try:
        out = engine.infer({"INPUT": np.ones((2, 3), np.float32)})  # rows, as a warm-up gives them
        assert out["SUM"][:, 0].tolist() == [3.0, 3.0] and out["END_OUT"][:, 0].tolist() == [3, 6]
        engine.warmup([1, 8])  # wattserve's own warm-up of a fixed-shape model, formed the same way
    finally:
        engine.close()
