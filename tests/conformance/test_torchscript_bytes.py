"""TorchScript models with BYTES (TYPE_STRING) tensors, served from a repository and called
with Triton's own clients.

Behaviours and their references:

- a TYPE_STRING input reaches ``forward`` as one flat ``list[str]`` (every element of the
  request, or of the whole batch, row-major), and a ``list[str]`` the model returns is a
  BYTES output: Triton's pytorch_backend (src/string_utilities.cc ``SetStringInputTensor``
  and ``SetStringBuffer``; libtorch.cc ``ReadOutputTensors``: "must be of type Tensor or
  list[str]");
- the models are Triton's QA string models: qa/common/gen_qa_models.py
  ``create_libtorch_modelfile`` (``libtorch_nobatch_object_object_object``,
  ``libtorch_nobatch_int32_object_object``: AddSub over ``int(s)``, outputs ``str(i)``, dims
  [16], max_batch_size 0); batching string models take dims [1] with an empty reshape
  (qa/common/test_util.py ``validate_for_libtorch_model``: "It supports batching when
  'reshape' field is set properly to empty shape");
- a model with numeric inputs and string outputs loads (Triton loads it; wattserve's
  warm-up ran it with zeros and failed on the list output);
- HTTP JSON, HTTP binary and gRPC: qa/L0_infer/infer_test.py (``use_http_json_tensors``,
  ``use_http``, ``use_grpc``);
- non-UTF-8 bytes for a ``list[str]`` input are the client's error (400 /
  INVALID_ARGUMENT), as for ONNX Runtime string inputs (engines/onnxruntime_engine.py).
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

WIDTH = 16


class AddSubStrings(torch.nn.Module):
    """gen_qa_models.py's string AddSub: strings in, strings out."""

    def forward(self, INPUT0: list[str], INPUT1: list[str]) -> tuple[list[str], list[str]]:
        a = torch.tensor([int(s) for s in INPUT0])
        b = torch.tensor([int(s) for s in INPUT1])
        return [str(i.item()) for i in a + b], [str(i.item()) for i in a - b]


class AddSubToStrings(torch.nn.Module):
    """Numbers in, strings out: the nobatch model that failed at load (warm-up with zeros)."""

    def forward(self, INPUT0: torch.Tensor, INPUT1: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        return [str(i.item()) for i in INPUT0 + INPUT1], INPUT0 - INPUT1


class Upper(torch.nn.Module):
    """A batching string model: one string per row, upper-cased, and its length."""

    def forward(self, TEXT: list[str]) -> tuple[list[str], torch.Tensor]:
        return [s.upper() for s in TEXT], torch.tensor([len(s) for s in TEXT], dtype=torch.int64)


class UpperOnly(torch.nn.Module):
    """One output, a bare ``List[str]`` (no tuple): Triton reads it as the only output."""

    def forward(self, TEXT: list[str]) -> list[str]:
        return [s.upper() for s in TEXT]


def _model(root: Path, name: str, module: torch.nn.Module, config: str) -> None:
    (root / name / "1").mkdir(parents=True)
    torch.jit.script(module).save(str(root / name / "1" / "model.pt"))
    (root / name / "config.pbtxt").write_text(f'platform: "pytorch_libtorch"\n{config}')


def _tensor(kind: str, name: str, datatype: str, dims: str, reshape: bool = False) -> str:
    extra = " reshape: { shape: [ ] }" if reshape else ""
    return f'{kind} [ {{ name: "{name}" data_type: TYPE_{datatype} dims: [ {dims} ]{extra} }} ]\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ts_bytes")
    _model(root, "libtorch_nobatch_object_object_object", AddSubStrings(), "max_batch_size: 0\n"
           + "".join(_tensor("input", f"INPUT{i}", "STRING", str(WIDTH)) for i in (0, 1))
           + "".join(_tensor("output", f"OUTPUT__{i}", "STRING", str(WIDTH)) for i in (0, 1)))  # fmt: skip
    _model(root, "libtorch_nobatch_int32_object_int32", AddSubToStrings(), "max_batch_size: 0\n"
           + "".join(_tensor("input", f"INPUT{i}", "INT32", str(WIDTH)) for i in (0, 1))
           + _tensor("output", "OUTPUT__0", "STRING", str(WIDTH))
           + _tensor("output", "OUTPUT__1", "INT32", str(WIDTH)))  # fmt: skip
    _model(root, "upper_batch", Upper(), "max_batch_size: 8\n"
           "dynamic_batching { max_queue_delay_microseconds: 100000 }\n"
           + _tensor("input", "TEXT", "STRING", "1", reshape=True)
           + _tensor("output", "UPPER__0", "STRING", "1", reshape=True)
           + _tensor("output", "LENGTH__1", "INT64", "1", reshape=True))  # fmt: skip
    _model(root, "upper_rows", UpperOnly(), "max_batch_size: 8\n"
           + _tensor("input", "TEXT", "STRING", "-1")
           + _tensor("output", "UPPER", "STRING", "-1"))  # fmt: skip
    port = free_port()
    settings = Settings(model_repository=root, torch_threads=1, grpc_port=port)
    with threaded_server(settings) as (url, _):
        yield url.removeprefix("http://"), f"127.0.0.1:{port}"


PROTOCOLS = ["http_json", "http_binary", "grpc"]


def infer(server, protocol: str, model: str, inputs: dict[str, np.ndarray], outputs: list[str]):
    """One request as a Triton user sends it; the named outputs as numpy."""
    http_url, grpc_url = server
    module = tgrpc if protocol == "grpc" else thttp
    client = module.InferenceServerClient(grpc_url if protocol == "grpc" else http_url)
    tensors = []
    for name, array in inputs.items():
        datatype = "BYTES" if array.dtype == object else "INT32"
        tensor = module.InferInput(name, list(array.shape), datatype)
        if protocol == "grpc":
            tensor.set_data_from_numpy(array)
        else:
            tensor.set_data_from_numpy(array, binary_data=protocol == "http_binary")
        tensors.append(tensor)
    if protocol == "grpc":
        requested = [tgrpc.InferRequestedOutput(n) for n in outputs]
    else:
        requested = [thttp.InferRequestedOutput(n, binary_data=protocol == "http_binary") for n in outputs]
    result = client.infer(model, tensors, outputs=requested)
    return {name: as_bytes(result.as_numpy(name)) for name in outputs}


def as_bytes(array: np.ndarray) -> np.ndarray:
    """tritonclient.http gives JSON BYTES outputs as ``str``, binary ones as ``bytes``."""
    if array.dtype != object:
        return array
    return np.array([v.encode() if isinstance(v, str) else v for v in array.ravel()], dtype=object).reshape(
        array.shape
    )


def ascii_upper(text: str) -> str:
    """TorchScript's ``str.upper`` changes ASCII letters only ("élan" -> "éLAN")."""
    return "".join(c.upper() if c.isascii() else c for c in text)


def strings(values) -> np.ndarray:
    return np.array([str(v).encode() for v in values], dtype=object)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_nobatch_strings_in_and_out(server, protocol):
    a, b = np.arange(WIDTH), np.arange(WIDTH) * 3 - 7
    out = infer(server, protocol, "libtorch_nobatch_object_object_object",
                {"INPUT0": strings(a), "INPUT1": strings(b)}, ["OUTPUT__0", "OUTPUT__1"])  # fmt: skip
    assert out["OUTPUT__0"].shape == (WIDTH,)
    assert [int(v) for v in out["OUTPUT__0"]] == list(a + b)
    assert [int(v) for v in out["OUTPUT__1"]] == list(a - b)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_numbers_in_strings_out_loads_and_answers(server, protocol):
    a = np.arange(WIDTH, dtype=np.int32)
    b = np.full(WIDTH, 5, dtype=np.int32)
    out = infer(server, protocol, "libtorch_nobatch_int32_object_int32", {"INPUT0": a, "INPUT1": b},
                ["OUTPUT__0", "OUTPUT__1"])  # fmt: skip
    assert out["OUTPUT__0"].dtype == object and out["OUTPUT__0"].shape == (WIDTH,)
    assert [int(v) for v in out["OUTPUT__0"]] == list(a + b)
    np.testing.assert_array_equal(out["OUTPUT__1"], a - b)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_batch_rows_come_back_to_their_requests(server, protocol):
    """Concurrent requests share a batch (100 ms delay); each gets its own rows back."""
    words = [["tiny"], ["wattserve", "élan"], ["x", "yy", "zzz"], ["bytes"]]

    def one(rows: list[str]):
        return infer(server, protocol, "upper_batch", {"TEXT": strings(rows).reshape(-1, 1)},
                     ["UPPER__0", "LENGTH__1"])  # fmt: skip

    stats = thttp.InferenceServerClient(server[0])

    def executions() -> int:
        return stats.get_inference_statistics("upper_batch")["model_stats"][0]["execution_count"]

    before = executions()
    with concurrent.futures.ThreadPoolExecutor(len(words)) as pool:
        results = list(pool.map(one, words))
    assert executions() - before < len(words)  # some requests rode in one batch
    for rows, out in zip(words, results, strict=True):
        assert out["UPPER__0"].shape == (len(rows), 1)
        assert [v.decode() for v in out["UPPER__0"].ravel()] == [ascii_upper(w) for w in rows]
        assert out["LENGTH__1"].ravel().tolist() == [len(w.encode()) for w in rows]  # TorchScript len: bytes


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_batched_variable_rows_flatten_row_major(server, protocol):
    text = np.array([[b"ab", b"cd", b"e"], [b"fgh", b"", b"ij"]], dtype=object)
    out = infer(server, protocol, "upper_rows", {"TEXT": text}, ["UPPER"])
    assert out["UPPER"].shape == (2, 3)
    assert out["UPPER"].tolist() == [[b"AB", b"CD", b"E"], [b"FGH", b"", b"IJ"]]


@pytest.mark.parametrize("protocol", ["http_binary", "grpc"])  # JSON carries text only
def test_non_utf8_string_is_the_clients_error(server, protocol):
    bad = np.array([b"ok", b"\xff\xfe"], dtype=object).reshape(2, 1)
    with pytest.raises(InferenceServerException) as info:
        infer(server, protocol, "upper_batch", {"TEXT": bad}, ["UPPER__0"])
    assert info.value.status() == ("400" if protocol == "http_binary" else "StatusCode.INVALID_ARGUMENT")
    assert "UTF-8" in info.value.message()
    out = infer(server, protocol, "upper_batch", {"TEXT": strings(["still"]).reshape(1, 1)}, ["UPPER__0"])
    assert out["UPPER__0"].ravel().tolist() == [b"STILL"]
