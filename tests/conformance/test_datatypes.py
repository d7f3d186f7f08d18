"""Every Triton datatype through every protocol: an ONNX model per datatype, served live
from a repository, called as a Triton user would.

Behaviours and their references:

- the datatypes (BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32, FP64, BF16) and their wire
  forms: Triton's protocol doc (docs/protocol/extension_binary_data.md and the KServe v2
  "Tensor Data Types" table); which models Triton's CI serves: qa/common/gen_qa_models.py
  (``create_onnx_modelfile``: Identity/Add/Sub/Cast models per input/output type);
- HTTP JSON, HTTP binary, gRPC raw: qa/L0_infer/infer_test.py (``_full_exact`` over every
  ``onnx_<type>_<type>_<type>`` model, with ``use_http_json_tensors``, ``use_http``,
  ``use_grpc``); BF16 travels only as binary over HTTP (tritonclient's InferInput refuses
  JSON BF16) and as raw contents over gRPC (InferTensorContents has no BF16 field);
- gRPC typed ``contents``: the KServe v2 gRPC protocol (grpc_service.proto's
  InferTensorContents: which field carries which datatype).
"""

from __future__ import annotations

import grpc
import httpx
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.grpc import service_pb2, service_pb2_grpc
from wattserve.server.settings import Settings

from support.datatype_models import (
    ONNX_TYPES,
    WIDTH,
    combine,
    make_datatype_repository,
    make_torchscript_datatype_repository,
)
from tests.servers import free_port, threaded_server

DATATYPES = list(ONNX_TYPES)
TYPED_FIELD = {  # KServe v2 InferTensorContents; FP16 and BF16 have none
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
    "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents",
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = make_datatype_repository(tmp_path_factory.mktemp("dtypes"))
    make_torchscript_datatype_repository(repository)
    port = free_port()
    settings = Settings(model_repository=repository, torch_threads=1, max_queue_delay_ms=0, grpc_port=port)
    with threaded_server(settings) as (url, _):
        yield url.removeprefix("http://"), f"127.0.0.1:{port}"


def values(datatype: str, rows: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Two inputs that use the type's range: negatives, values past the signed range of
    unsigned types, fractions (exact in the type), booleans both ways."""
    dtype = ONNX_TYPES[datatype][1]
    rng = np.random.default_rng(sum(map(ord, datatype)))
    shape = (rows, WIDTH)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(bool), rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        b = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        a.flat[0], b.flat[0] = info.max, info.min  # the extremes, both ways
        return a, b
    # floats: quarters in a range every float type (BF16's 8-bit mantissa) holds exactly
    a = (rng.integers(-512, 512, shape) / 4).astype(dtype)
    b = (rng.integers(-512, 512, shape) / 4).astype(dtype)
    return a, b


class Model:
    """One served model of one datatype on one engine: its name, tensor names, and what it
    computes (ONNX: identity and a sum; TorchScript: both inputs passed through)."""

    def __init__(self, engine: str, datatype: str) -> None:
        self.datatype = datatype
        self.onnx = engine == "onnx"
        self.name = f"{'dt' if self.onnx else 'ts'}_{datatype.lower()}"
        self.inputs = ("INPUT0", "INPUT1") if self.onnx else ("INPUT__0", "INPUT__1")
        self.outputs = ("OUTPUT0", "OUTPUT1") if self.onnx else ("OUTPUT__0", "OUTPUT__1")

    def expected(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(over="ignore"):
            return (a, combine(self.datatype, a, b)) if self.onnx else (a, b)


ENGINES = ["onnx", "torchscript"]


def check(model: Model, got0: np.ndarray, got1: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    want0, want1 = model.expected(a, b)
    for got, want in ((got0, want0), (got1, want1)):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bit for bit


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_http(server, engine, datatype, binary):
    if datatype == "BF16" and not binary:
        pytest.skip("tritonclient refuses JSON BF16 (test_bf16_json_numbers covers wattserve's side)")
    http_url, _ = server
    model = Model(engine, datatype)
    a, b = values(datatype)
    client = thttp.InferenceServerClient(http_url)
    inputs = [thttp.InferInput(n, list(x.shape), datatype) for n, x in zip(model.inputs, (a, b), strict=True)]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [thttp.InferRequestedOutput(n, binary_data=binary) for n in model.outputs]
    result = client.infer(model.name, inputs, outputs=outputs)
    for out in result.get_response()["outputs"]:
        assert out["datatype"] == datatype
        assert ("data" in out) is not binary
    check(model, *(result.as_numpy(n) for n in model.outputs), a, b)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("datatype", DATATYPES)
def test_grpc_raw(server, engine, datatype):
    _, grpc_url = server
    model = Model(engine, datatype)
    a, b = values(datatype, rows=3)
    client = tgrpc.InferenceServerClient(grpc_url)
    inputs = [tgrpc.InferInput(n, list(x.shape), datatype) for n, x in zip(model.inputs, (a, b), strict=True)]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model.name, inputs)
    assert {o.datatype for o in result.get_response().outputs} == {datatype}
    check(model, *(result.as_numpy(n) for n in model.outputs), a, b)


def typed_request(model: Model, a: np.ndarray, b: np.ndarray) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model.name)
    for name, x in zip(model.inputs, (a, b), strict=True):
        tensor = request.inputs.add(name=name, datatype=model.datatype, shape=list(x.shape))
        if model.datatype in TYPED_FIELD:
            getattr(tensor.contents, TYPED_FIELD[model.datatype]).extend(x.ravel().tolist())
        else:
            tensor.contents.fp32_contents.extend(x.ravel().astype(np.float32).tolist())
    return request


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d in TYPED_FIELD])
def test_grpc_typed_contents(server, engine, datatype):
    _, grpc_url = server
    model = Model(engine, datatype)
    a, b = values(datatype)
    with grpc.insecure_channel(grpc_url) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            typed_request(model, a, b), timeout=30
        )
    got = {
        o.name: np.frombuffer(raw, dtype=ONNX_TYPES[datatype][1]).reshape(o.shape)
        for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }
    check(model, *(got[n] for n in model.outputs), a, b)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_grpc_typed_contents_refused_where_kserve_has_no_field(server, datatype):
    """InferTensorContents has no FP16/BF16 field: a clear INVALID_ARGUMENT, never a 500."""
    _, grpc_url = server
    model = Model("onnx", datatype)
    a, b = values(datatype)
    with grpc.insecure_channel(grpc_url) as channel, pytest.raises(grpc.RpcError) as err:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(typed_request(model, a, b), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "raw_input_contents" in err.value.details()


def test_bf16_json_numbers(server):
    """Triton refuses BF16 in JSON both ways ("receiving/sending BF16 data via JSON is not
    supported", src/http_server.cc); wattserve takes JSON numbers (rounded to BF16) and
    answers the BF16 values as JSON numbers: a superset, listed in docs/triton.md's deviations."""
    http_url, _ = server
    body = {"inputs": [{"name": n, "shape": [1, 4], "datatype": "BF16", "data": [1.5, -2, 3.25, 0.5]}
                       for n in ("INPUT0", "INPUT1")]}  # fmt: skip
    response = httpx.post(f"http://{http_url}/v2/models/dt_bf16/infer", json=body)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["OUTPUT1"]["datatype"] == "BF16"
    assert outputs["OUTPUT1"]["data"] == [3.0, -4.0, 6.5, 1.0]


def test_metadata_names_every_datatype(server):
    http_url, _ = server
    client = thttp.InferenceServerClient(http_url)
    for engine in ENGINES:
        for datatype in DATATYPES:
            meta = client.get_model_metadata(Model(engine, datatype).name)
            assert [t["datatype"] for t in meta["inputs"] + meta["outputs"]] == [datatype] * 4


def test_bf16_is_ml_dtypes_bfloat16_end_to_end(server):
    """Triton's client (r26.06+) speaks BF16 as ml_dtypes.bfloat16; so does wattserve."""
    http_url, _ = server
    a = np.array([[1.5, -2.0, 3.25, 0.0078125]], dtype=ml_dtypes.bfloat16)
    client = thttp.InferenceServerClient(http_url)
    inputs = [thttp.InferInput(n, [1, WIDTH], "BF16") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(a, binary_data=True)
    result = client.infer("dt_bf16", inputs)
    assert result.as_numpy("OUTPUT1").tolist() == [[3.0, -4.0, 6.5, 0.015625]]
