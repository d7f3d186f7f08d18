"""``--input-data``: perf_analyzer's JSON files and directories read into the tensors sent,
and every misfit refused before the run with the entry and input it is about."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import ml_dtypes
import numpy as np
import orjson
import pytest
from wattserve.loadgen.input_data import InputDataError, load_input_data, zero_data
from wattserve.loadgen.payloads import InputSpec, encode_requests, input_specs
from wattserve.server.core.bytes_tensors import deserialize_bytes

META = {
    "inputs": [
        {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "text", "datatype": "BYTES", "shape": [-1, 1]},
        {"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
    ]
}


def write(tmp_path: Path, doc) -> Path:
    path = tmp_path / "data.json"
    path.write_text(json.dumps(doc))
    return path


def test_json_entries_become_one_request_each_in_order(tmp_path) -> None:
    """Content as numbers and strings, content with a shape, and b64 (BYTES: its elements
    each behind a 4-byte length, the form perf_analyzer sends unchanged)."""
    specs = input_specs(META, allow_variable=True)
    assert specs[2].shape == (1, -1)
    path = write(tmp_path, {"data": [
        {"x": [1, 2, 3], "text": ["héllo"], "ids": {"content": [[5, 6]], "shape": [2]}},
        {"x": [[4, 5, 6]], "text": {"b64": base64.b64encode(b"\x05\x00\x00\x00\x00\xffraw").decode()},
         "ids": {"content": [7, 8, 9, 10], "shape": [1, 4]}},
    ]})  # fmt: skip
    first, second = load_input_data(path, specs)
    assert first["x"].dtype == np.float32 and first["x"].tolist() == [[1, 2, 3]]
    assert first["text"].tolist() == [[b"h\xc3\xa9llo"]]
    assert first["ids"].dtype == np.int64 and first["ids"].shape == (1, 2)  # batch dim added
    assert second["text"].tolist() == [[b"\x00\xffraw"]] and second["ids"].shape == (1, 4)

    requests = encode_requests("m", specs, "binary", [first, second])
    header_len = int(requests[1].headers["Inference-Header-Content-Length"])
    header = orjson.loads(requests[1].body[:header_len])
    assert [i["shape"] for i in header["inputs"]] == [[1, 3], [1, 1], [1, 4]]  # each request's own
    raw = requests[1].body[header_len:]
    assert np.frombuffer(raw[:12], "<f4").tolist() == [4, 5, 6]
    assert deserialize_bytes(raw[12:21], "text", (1, 1)).tolist() == [[b"\x00\xffraw"]]
    assert np.frombuffer(raw[21:], "<i8").tolist() == [7, 8, 9, 10]


def test_b64_numbers_are_little_endian_elements_and_bf16_its_16_bits(tmp_path) -> None:
    specs = [InputSpec("a", "INT32", (1, 2)), InputSpec("h", "BF16", (1, 2))]
    h = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    path = write(tmp_path, {"data": [{
        "a": {"b64": base64.b64encode(np.array([1, -2], "<i4").tobytes()).decode()},
        "h": {"b64": base64.b64encode(h.view(np.uint16).astype("<u2").tobytes()).decode()},
    }]})  # fmt: skip
    (tensors,) = load_input_data(path, specs)
    assert tensors["a"].tolist() == [[1, -2]]
    assert tensors["h"].dtype == ml_dtypes.bfloat16 and tensors["h"].astype(np.float32).tolist() == [
        [1.5, -2.0]
    ]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"data": []}, "at least one entry"),
        ([1, 2], "at least one entry"),
        ({"data": [{"x": [1, 2, 3], "text": ["a"]}]}, r"data\[0\]: input 'ids' is missing"),
        ({"data": [{"x": [1, 2, 3], "text": ["a"], "ids": [1], "y": [0]}]}, "no input 'y'"),
        ({"data": [{"x": [1, 2], "text": ["a"], "ids": {"content": [1], "shape": [1]}}]}, r"2 elements for shape \[1, 3\]"),
        ({"data": [{"x": [1, 2, 3], "text": ["a"], "ids": [1]}]}, 'variable dimensions.*give "shape"'),
        ({"data": [{"x": [1, 2, 3], "text": [5], "ids": {"content": [1], "shape": [1]}}]}, "takes strings"),
        ({"data": [{"x": ["a", 2, 3], "text": ["a"], "ids": {"content": [1], "shape": [1]}}]}, "not FP32 numbers"),
        ({"data": [{"x": {"b64": "%%"}, "text": ["a"], "ids": {"content": [1], "shape": [1]}}]}, "not base64"),
        ({"data": [{"x": {"b64": "AAA="}, "text": ["a"], "ids": {"content": [1], "shape": [1]}}]}, "whole number of FP32"),
        ({"data": [{"x": [1, 2, 3], "text": ["a"], "ids": {"content": [1], "shape": [1, 1, 1]}}]}, "does not fit"),
        ({"data": [{"x": [1, 2, 3], "text": ["a"], "ids": {"shape": [1]}}]}, 'expected "content" or "b64"'),
        # b64 of a BYTES input is the wire form, as perf_analyzer sends it: raw PNG bytes read
        # "\x89PNG" as a 1.2 GB length
        ({"data": [{"x": [1, 2, 3], "text": {"b64": base64.b64encode(b"\x89PNG\r\n").decode()},
                    "ids": {"content": [1], "shape": [1]}}]}, "each behind a 4-byte length"),
    ],
)  # fmt: skip
def test_misfits_name_the_entry_and_input(tmp_path, doc, message) -> None:
    specs = input_specs(META, allow_variable=True)
    with pytest.raises(InputDataError, match=message):
        load_input_data(write(tmp_path, doc), specs)


def test_not_json_and_missing_path(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(InputDataError, match="not JSON"):
        load_input_data(bad, [])
    with pytest.raises(InputDataError, match="no such file"):
        load_input_data(tmp_path / "absent.json", [])


def test_directory_holds_one_raw_file_per_input(tmp_path) -> None:
    specs = [InputSpec("x", "FP32", (1, 3)), InputSpec("text", "BYTES", (1, 2))]
    (tmp_path / "x").write_bytes(np.array([1, 2, 3], "<f4").tobytes())
    (tmp_path / "text").write_text("first line\nsecond\n")
    (tensors,) = load_input_data(tmp_path, specs)
    assert tensors["x"].tolist() == [[1, 2, 3]]
    assert tensors["text"].tolist() == [[b"first line", b"second"]]
    (tmp_path / "x").write_bytes(np.array([1, 2], "<f4").tobytes())
    with pytest.raises(InputDataError, match="2 elements"):
        load_input_data(tmp_path, specs)
    (tmp_path / "x").unlink()
    with pytest.raises(InputDataError, match="no file 'x'"):
        load_input_data(tmp_path, specs)


def test_zero_is_zeros_and_empty_strings() -> None:
    assert zero_data([InputSpec("x", "FP32", (1,)), InputSpec("t", "BYTES", (1,))]) == {"x": 0.0, "t": ""}
