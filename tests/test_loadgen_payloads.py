"""Request bodies: KServe v2 JSON, the binary tensor extension, image uploads, protocol choice."""

from __future__ import annotations

import io

import numpy as np
import orjson
import pytest
from PIL import Image
from wattserve.loadgen.calibration_server import running_calibration_server
from wattserve.loadgen.client import make_session, send
from wattserve.loadgen.payloads import (
    InputSpec,
    binary_body,
    image_requests,
    input_specs,
    json_body,
    tensor_requests,
)
from wattserve.loadgen.runner import _queued, prepare_target

META = {
    "name": "m",
    "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [-1, 3, 2]},
        {"name": "k", "datatype": "INT64", "shape": [-1, 1]},
    ],
}


def test_input_specs_make_the_batch_dimension_one() -> None:
    specs = input_specs(META)
    assert specs == [InputSpec("x", "FP32", (1, 3, 2)), InputSpec("k", "INT64", (1, 1))]
    with pytest.raises(ValueError, match="variable dimension"):
        input_specs({"inputs": [{"name": "t", "datatype": "FP32", "shape": [-1, -1]}]})
    fixed = input_specs({"inputs": [{"name": "t", "datatype": "FP32", "shape": [-1, -1]}]}, {"t": [1, 5]})
    assert fixed[0].shape == (1, 5)
    with pytest.raises(ValueError, match="not a KServe v2 datatype"):
        input_specs({"inputs": [{"name": "s", "datatype": "TYPE_STRING", "shape": [-1]}]})


def test_binary_body_is_header_then_little_endian_tensors() -> None:
    specs = input_specs(META)
    x = np.arange(6, dtype=np.float32).reshape(1, 3, 2)
    k = np.array([[7]], dtype=np.int64)
    body, header_len = binary_body(specs, {"x": x, "k": k})
    header = orjson.loads(body[:header_len])
    assert header["parameters"] == {"binary_data_output": True}
    sizes = [i["parameters"]["binary_data_size"] for i in header["inputs"]]
    assert sizes == [24, 8]
    assert [i["shape"] for i in header["inputs"]] == [[1, 3, 2], [1, 1]]
    raw = body[header_len:]
    assert np.frombuffer(raw[:24], "<f4").tolist() == x.reshape(-1).tolist()
    assert np.frombuffer(raw[24:], "<i8").tolist() == [7]


def test_json_body_and_fixed_values() -> None:
    specs = input_specs(META)
    doc = orjson.loads(json_body(specs, {"x": np.ones((1, 3, 2), np.float32), "k": np.zeros((1, 1))}))
    assert doc["inputs"][0]["data"] == [1.0] * 6 and doc["inputs"][0]["datatype"] == "FP32"
    reqs = tensor_requests("m", specs, "json", count=3, seed=0, fixed_values={"k": 20})
    bodies = [orjson.loads(r.body) for r in reqs]
    assert all(b["inputs"][1]["data"] == [20] for b in bodies)
    assert bodies[0]["inputs"][0]["data"] != bodies[1]["inputs"][0]["data"]  # distinct payloads
    assert reqs[0].path == "/v2/models/m/infer"


async def test_auto_protocol_prefers_binary_and_falls_back_to_json() -> None:
    async with make_session(10) as session:
        async with running_calibration_server() as (_, url):
            target = await prepare_target(session, url, "identity", "auto")
            assert target.protocol == "binary"
            assert target.metrics_url is None  # the calibration server has no /metrics
            out = await send(session, url, target.requests[0])
            assert out.status == "200"
        async with running_calibration_server(binary=False) as (_, url):
            target = await prepare_target(session, url, "identity", "auto")
            assert target.protocol == "json"
            with pytest.raises(RuntimeError, match="binary"):
                await prepare_target(session, url, "identity", "binary")


async def test_images_are_uploaded_as_multipart_file_field(tmp_path) -> None:
    for i in range(3):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (i * 40, 0, 0)).save(buf, "PNG")
        (tmp_path / f"img{i}.png").write_bytes(buf.getvalue())
    (tmp_path / "notes.txt").write_text("not an image")
    reqs = image_requests("identity", tmp_path)
    assert [r.file[0] for r in reqs] == ["img0.png", "img1.png", "img2.png"]
    assert reqs[0].path == "/v2/models/identity/classify"
    async with make_session(10) as session, running_calibration_server() as (_, url):
        target = await prepare_target(session, url, "identity", "image", images=str(tmp_path))
        assert target.protocol == "image"
        statuses = [(await send(session, url, r)).status for r in target.requests]
        assert statuses == ["200"] * 3
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no images"):
        image_requests("identity", tmp_path / "empty")


def test_a_probe_counts_as_queued_when_its_models_queue_gauge_holds_a_request() -> None:
    """prepare_target stops waiting for a probe that a static batcher holds once the server's
    queue gauge shows it (instead of waiting PROBE_TIMEOUT_S): wattserve's or Triton's gauge,
    for that model only, at least one request."""
    text = (
        'wattserve_queue_depth{batcher="static",model="identity"} 1.0\n'
        'wattserve_queue_depth{batcher="static",model="other"} 0.0\n'
    )
    assert _queued(text, "identity") and not _queued(text, "other") and not _queued(text, "identity2")
    assert _queued('nv_inference_pending_request_count{model="m",version="1"} 2\n', "m")
    assert not _queued('wattserve_inflight_requests{batcher="static",model="m"} 3.0\n', "m")
    assert not _queued("", "m")
