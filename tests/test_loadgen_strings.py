"""The load generator on models with string (BYTES) and BF16 inputs, as perf_analyzer drives
them: random strings of ``--string-length`` (default 128) or ``--string-data``, BF16 as raw
16-bit words in the binary extension. Bodies are checked by decoding them with the server's
own decoders, and end to end against a real server whose model answers what it received.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import ml_dtypes
import numpy as np
import orjson
import pytest
import torch
from wattserve.loadgen.cli import main
from wattserve.loadgen.client import make_session
from wattserve.loadgen.payloads import (
    InputSpec,
    UnencodableError,
    binary_body,
    input_specs,
    json_body,
    tensor_requests,
)
from wattserve.loadgen.runner import prepare_target
from wattserve.server.core.bytes_tensors import deserialize_bytes
from wattserve.server.settings import Settings

from support.datatype_models import make_datatype_repository
from tests.servers import threaded_server

ALNUM = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
STRINGS = [InputSpec("TEXT", "BYTES", (1, 3))]


def _split_binary(body: bytes, header_len: int) -> tuple[dict, bytes]:
    return orjson.loads(body[:header_len]), body[header_len:]


def test_random_strings_have_the_length_asked_and_differ_between_requests() -> None:
    requests = tensor_requests("m", STRINGS, "binary", count=4, seed=3, string_length=9)
    seen = []
    for request in requests:
        header, raw = _split_binary(request.body, int(request.headers["Inference-Header-Content-Length"]))
        assert header["inputs"][0]["datatype"] == "BYTES"
        assert header["inputs"][0]["parameters"]["binary_data_size"] == len(raw) == 3 * (4 + 9)
        strings = deserialize_bytes(raw, "TEXT", (1, 3))  # the server's own decoder
        assert strings.shape == (1, 3)
        for value in strings.ravel():
            assert len(value) == 9 and set(value) <= ALNUM
        seen.append(tuple(strings.ravel()))
    assert len(set(seen)) == 4  # distinct bodies, not one string repeated
    default = tensor_requests("m", STRINGS, "json", count=1, seed=0)
    data = orjson.loads(default[0].body)["inputs"][0]["data"]
    assert [len(s) for s in data] == [128] * 3  # perf_analyzer's --string-length default
    assert tensor_requests("m", STRINGS, "json", count=1, seed=0, string_length=0)[0].body.count(b'""') == 3
    with pytest.raises(ValueError, match=">= 0"):
        tensor_requests("m", STRINGS, "json", count=1, seed=0, string_length=-1)


def test_fixed_strings_and_numbers() -> None:
    specs = [InputSpec("TEXT", "BYTES", (1, 2)), InputSpec("steps", "INT32", (1, 1))]
    body = json_body(specs, {"TEXT": np.array([["héllo", "x"]], dtype=object), "steps": np.array([[3]])})
    assert orjson.loads(body)["inputs"][0]["data"] == ["héllo", "x"]
    (request,) = tensor_requests(
        "m", specs, "json", count=1, seed=0, fixed_values={"TEXT": "héllo", "steps": "20"}
    )
    doc = orjson.loads(request.body)
    assert doc["inputs"][0]["data"] == ["héllo", "héllo"] and doc["inputs"][1]["data"] == [20]
    with pytest.raises(UnencodableError, match="not UTF-8"):
        json_body(specs[:1], {"TEXT": np.array([[b"\xff", b"x"]], dtype=object)})
    with pytest.raises(ValueError, match="needs a number"):
        tensor_requests("m", specs, "json", count=1, seed=0, fixed_values={"steps": "many"})


def test_bf16_travels_as_its_16_bits_in_binary_and_as_numbers_in_json() -> None:
    specs = [InputSpec("x", "BF16", (1, 4))]
    x = np.array([[1.5, -2.0, 3.25, 0.5]], dtype=ml_dtypes.bfloat16)
    body, header_len = binary_body(specs, {"x": x})
    header, raw = _split_binary(body, header_len)
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 8
    assert np.frombuffer(raw, "<u2").tolist() == x.view(np.uint16).ravel().tolist()
    assert orjson.loads(json_body(specs, {"x": x}))["inputs"][0]["data"] == [1.5, -2.0, 3.25, 0.5]
    (random,) = tensor_requests("m", specs, "binary", count=1, seed=0)
    values = np.frombuffer(random.body[-8:], "<u2").view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.all(np.isfinite(values)) and len(set(values.tolist())) > 1  # random normals, not zeros


def test_every_kserve_datatype_gets_random_data_and_unknown_ones_are_refused() -> None:
    for datatype in ("BOOL", "UINT8", "INT64", "FP16", "FP64", "BF16", "BYTES"):
        (spec,) = input_specs({"inputs": [{"name": "t", "datatype": datatype, "shape": [-1, 2]}]})
        assert tensor_requests("m", [spec], "binary", count=1, seed=0)[0].body
    with pytest.raises(ValueError, match="not a KServe v2 datatype"):
        input_specs({"inputs": [{"name": "t", "datatype": "STRING", "shape": [1]}]})


class Upper(torch.nn.Module):
    """A batching string model: each row's string upper-cased, and its length."""

    def forward(self, TEXT: list[str]) -> tuple[list[str], torch.Tensor]:
        return [s.upper() for s in TEXT], torch.tensor([len(s) for s in TEXT], dtype=torch.int64)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = make_datatype_repository(tmp_path_factory.mktemp("strings"), ["BF16"])
    (root / "upper" / "1").mkdir(parents=True)
    torch.jit.script(Upper()).save(str(root / "upper" / "1" / "model.pt"))
    (root / "upper" / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } } ]\n'
        'output [ { name: "UPPER__0" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } } ]\n'
        'output [ { name: "LENGTH__1" data_type: TYPE_INT64 dims: [ 1 ] reshape: { shape: [ ] } } ]\n'
    )
    with threaded_server(Settings(model_repository=root, torch_threads=1, max_queue_delay_ms=1)) as (url, _):
        yield url


@pytest.mark.parametrize("protocol", ["binary", "json"])
async def test_the_server_receives_the_strings_the_generator_sends(server: str, protocol: str) -> None:
    async with make_session(10) as session:
        target = await prepare_target(session, server, "upper", protocol, string_length=5, metrics_url=None)
        fixed = await prepare_target(session, server, "upper", protocol, string_data="ab c", metrics_url=None)
    for request, want in ((target.requests[0], None), (fixed.requests[0], b"ab c")):
        headers = dict(request.headers)
        if protocol == "binary":  # answer in JSON, to read it here
            header_len = int(headers["Inference-Header-Content-Length"])
            header = orjson.loads(request.body[:header_len])
            header["parameters"] = {}
            new_header = orjson.dumps(header)
            body = new_header + request.body[header_len:]
            headers["Inference-Header-Content-Length"] = str(len(new_header))
            sent = deserialize_bytes(request.body[header_len:], "TEXT", (1, 1))[0, 0]
        else:
            body = request.body
            sent = orjson.loads(body)["inputs"][0]["data"][0].encode()
        async with httpx.AsyncClient() as http:
            response = await http.post(f"{server}{request.path}", content=body, headers=headers)
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
        assert outputs["LENGTH__1"] == [len(sent)] == [5 if want is None else 4]
        assert outputs["UPPER__0"] == [sent.decode().upper()]
        if want is not None:
            assert sent == want


def test_loadgen_drives_string_and_bf16_models_without_errors(server: str, tmp_path: Path) -> None:
    for model, extra in (("upper", ["--string-length", "16"]), ("dt_bf16", [])):
        out = tmp_path / model
        code = main(
            ["loadgen", "--url", server, "--model", model, "--arrival", "constant", "--rate", "40",
             "--warmup", "0.2", "--duration", "1", "--max-lag-ms", "200", "--metrics-url", "none",
             "--out", str(out), "--no-progress", *extra]
        )  # fmt: skip
        assert code == 0
        (run,) = json.loads((out / "results.json").read_text())["runs"]
        assert run["target"]["protocol"] == "binary"
        assert run["sent"] == 40 and run["failed"] == 0 and run["completed"] == 40


async def test_input_data_file_and_zero_reach_the_model(server: str, tmp_path: Path) -> None:
    data = tmp_path / "strings.json"
    data.write_text(
        json.dumps({"data": [{"TEXT": ["first"]}, {"TEXT": {"content": ["second"], "shape": [1]}}]})
    )
    async with make_session(10) as session:
        given = await prepare_target(session, server, "upper", "json", input_data=str(data), metrics_url=None)
        zero = await prepare_target(session, server, "upper", "json", input_data="zero", metrics_url=None)
    assert len(given.requests) == 2  # one per entry, sent round robin
    answers = []
    async with httpx.AsyncClient() as http:
        for request in [*given.requests, zero.requests[0]]:
            response = await http.post(
                f"{server}{request.path}", content=request.body, headers=request.headers
            )
            assert response.status_code == 200, response.text
            answers.append({o["name"]: o["data"] for o in response.json()["outputs"]})
    assert [a["UPPER__0"] for a in answers] == [["FIRST"], ["SECOND"], [""]]
    assert [a["LENGTH__1"] for a in answers] == [[5], [6], [0]]


def test_loadgen_sends_a_perf_analyzer_input_data_file(server: str, tmp_path: Path) -> None:
    data = tmp_path / "strings.json"
    data.write_text(json.dumps({"data": [{"TEXT": ["a"]}, {"TEXT": ["bb"]}, {"TEXT": ["ccc"]}]}))
    out = tmp_path / "run"
    code = main(
        ["loadgen", "--url", server, "--model", "upper", "--arrival", "constant", "--rate", "30",
         "--warmup", "0.2", "--duration", "1", "--max-lag-ms", "200", "--metrics-url", "none",
         "--input-data", str(data), "--out", str(out), "--no-progress"]
    )  # fmt: skip
    assert code == 0
    (run,) = json.loads((out / "results.json").read_text())["runs"]
    assert run["sent"] == 30 and run["failed"] == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [{"WRONG": ["a"]}]}))
    refused = tmp_path / "refused.json"  # fits the model, which refuses it: the probe's 400 in one line
    refused.write_text(
        json.dumps({"data": [{"TEXT": {"b64": base64.b64encode(b"\x02\x00\x00\x00\xff\xfe").decode()}}]})
    )
    with pytest.raises(SystemExit, match=r"loadgen: error: probe request to upper failed: binary: HTTP 400"):
        main(["loadgen", "--url", server, "--model", "upper", "--rate", "5", "--duration", "1",
              "--input-data", str(refused), "--out", str(tmp_path / "refused"), "--no-progress"])  # fmt: skip
    with pytest.raises(SystemExit, match=r"loadgen: error: .*no input 'WRONG'"):
        main(["loadgen", "--url", server, "--model", "upper", "--rate", "5", "--duration", "1",
              "--input-data", str(bad), "--out", str(tmp_path / "bad"), "--no-progress"])  # fmt: skip
