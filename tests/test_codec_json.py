"""JSON bodies with NaN/Infinity tokens (perf_analyzer's random data) decode like any other:
the same values Python's own json reads, the same refusals, and Triton's nesting limit."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wattserve.engines.base import TensorSpec
from wattserve.server.core.request import BadRequest
from wattserve.server.http.codec import MAX_JSON_DEPTH, parse_infer_request

SPEC = TensorSpec("input", (4096,), "FP32")
OUT = TensorSpec("output", (4096,), "FP32")


def random_bits_body(seed: int = 0) -> tuple[bytes, np.ndarray]:
    """What perf_analyzer sends in JSON mode: random 32-bit patterns as FP32, every
    non-finite one written as a NaN/Infinity/-Infinity token."""
    bits = np.random.default_rng(seed).integers(0, 2**32, size=4096, dtype=np.uint32)
    bits[:4] = [0x7FC00000, 0x7F800000, 0xFF800000, 0x00000001]  # NaN, +Inf, -Inf, a subnormal
    values = bits.view(np.float32)
    doc = {"inputs": [{"name": "input", "shape": [1, 4096], "datatype": "FP32",
                       "data": [float(v) for v in values]}]}  # fmt: skip
    body = json.dumps(doc).encode()  # json writes NaN, Infinity, -Infinity
    assert b"NaN" in body and b"-Infinity" in body
    return body, values


def parse(body: bytes, check_values: bool = False):
    return parse_infer_request(body, None, [SPEC], [OUT], max_batch_size=8, check_values=check_values)


def test_random_bit_patterns_decode_to_the_values_sent():
    body, values = random_bits_body()
    got = parse(body).inputs["input"][0]
    finite = np.isfinite(values)
    assert np.array_equal(got[finite], values[finite])  # every finite value, subnormals included
    assert np.array_equal(np.isnan(got), np.isnan(values))
    assert np.array_equal(got[np.isinf(values)], values[np.isinf(values)])  # signs kept
    # the same array Python's own json gives (the parser this replaced)
    stdlib = np.asarray(json.loads(body)["inputs"][0]["data"], np.float32)
    assert np.array_equal(got, stdlib, equal_nan=True)


def test_nan_refused_only_when_the_model_checks_values():
    body, _ = random_bits_body(1)
    parse(body)  # computed like any other value (Triton parity)
    with pytest.raises(BadRequest, match="NaN or Inf"):
        parse(body, check_values=True)


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs":[{"name":"input","data":[NaN,1,]}]}',  # trailing comma
        b'{"inputs":[NaN]',  # unterminated
        b'{"inputs":[nan]}',  # lower-case is no token
        b'{"inputs":[Infinity]} trailing',
        b'{"a":"\xff", "b":NaN}',  # not UTF-8
    ],
)
def test_malformed_bodies_with_tokens_are_400s(body):
    with pytest.raises(BadRequest, match="malformed JSON") as caught:
        parse(body)
    assert caught.value.status.name == "INVALID_ARG"


def nested(levels: int, nan: bool) -> bytes:
    """A body whose deepest value sits inside ``levels`` objects/arrays (the top object counts)."""
    inner = b"[" * (levels - 1) + (b"NaN" if nan else b"1") + b"]" * (levels - 1)
    return b'{"inputs":' + inner + b"}"


@pytest.mark.parametrize("nan", [False, True])
def test_nesting_beyond_tritons_limit_is_refused_in_its_words(nan):
    with pytest.raises(BadRequest) as at_limit:  # 100 levels parse; the body is refused later
        parse(nested(MAX_JSON_DEPTH, nan))
    assert "nesting" not in str(at_limit.value)
    for levels in (MAX_JSON_DEPTH + 1, 5000):  # 5000: past both parsers' own limits
        with pytest.raises(BadRequest, match=r"^JSON nesting depth exceeds maximum allowed limit \(100\)$"):
            parse(nested(levels, nan))


def test_nested_tensor_data_within_the_limit_is_served():
    data = np.arange(2 * 4096, dtype=np.float32).reshape(2, 4096)
    doc = {"inputs": [{"name": "input", "shape": [2, 4096], "datatype": "FP32", "data": data.tolist()}]}
    body = json.dumps(doc).replace("0.0,", "NaN,", 1).encode()  # nested rows, through the NaN path
    got = parse(body).inputs["input"]
    assert np.isnan(got[0, 0]) and np.array_equal(got.ravel()[1:], data.ravel()[1:])


def test_tokens_anywhere_and_token_like_strings_parse_alike():
    """A token first seen past the first 64 KB (orjson tries, then rapidjson), and an
    ordinary body whose id says NaN (rapidjson at once): both read as Python's json reads them."""
    values = [0.5] * 20000 + [float("nan"), float("inf")]
    late = json.dumps({"inputs": [{"name": "input", "shape": [1, len(values)], "datatype": "FP32",
                                   "data": values}]}).encode()  # fmt: skip
    assert late.find(b"NaN") > 64 * 1024
    spec = TensorSpec("input", (len(values),), "FP32")
    got = parse_infer_request(late, None, [spec], [OUT], max_batch_size=8).inputs["input"][0]
    assert np.array_equal(got, np.asarray(values, np.float32), equal_nan=True)
    named = json.dumps({"id": "NaN-Infinity", "inputs": [{"name": "input", "shape": [1, 4096], "datatype": "FP32",
                                                          "data": [1.0] * 4096}]}).encode()  # fmt: skip
    request = parse(named)
    assert request.id == "NaN-Infinity" and (request.inputs["input"] == 1.0).all()
