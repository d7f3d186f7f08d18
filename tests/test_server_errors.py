"""Every bad input gets its 4xx before any queue, and the server answers the next good
request; overload gets 503 + Retry-After; deadlines 503 "Request timeout expired" (Triton's); a gone client is never computed."""

from __future__ import annotations

import asyncio
import io
import time

import httpx
import numpy as np
import pytest
from wattserve.server.settings import Settings

from tests.gated_engine import GatedEngine
from tests.servers import threaded_server

GOOD = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]}


def with_input(**changes):
    tensor = {**GOOD["inputs"][0], **changes}
    return {"inputs": [tensor]}


@pytest.fixture(scope="module")
def gated():
    engine = GatedEngine(max_batch_size=4)
    settings = Settings(model="gated", batcher="dynamic", max_batch_size=4, max_queue_delay_ms=0,
                        max_queue_size=3, max_body_bytes=4096, retry_after_s=2,
                        check_values=True)  # fmt: skip  # NaN/Inf are 400 only when checked
    with threaded_server(settings, engine_factory=lambda s: engine) as (url, app):
        yield url, engine, app


def post(url: str, body=None, content: bytes | None = None, headers=None, path="gated") -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{path}/infer", json=body, content=content, headers=headers,
                      timeout=30)  # fmt: skip


def binary_case(declared: int, blob: bytes) -> dict:
    """A binary-extension request whose tensor declares ``declared`` bytes."""
    header = (
        b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","parameters":'
        b'{"binary_data_size":%d}}]}' % declared
    )
    return dict(content=header + blob, headers={"Inference-Header-Content-Length": str(len(header))})


BAD_CASES = {
    "malformed json": dict(content=b"{not json"),
    "not an object": dict(content=b"[1, 2]"),
    "no inputs": dict(body={"inputs": []}),
    "unknown input": dict(body=with_input(name="z")),
    "wrong shape": dict(body=with_input(shape=[1, 3], data=[1.0, 2.0, 3.0])),
    "batch too big": dict(body=with_input(shape=[5, 2], data=[1.0] * 10)),
    "wrong datatype": dict(body=with_input(datatype="FP64")),
    "element count": dict(body=with_input(data=[1.0, 2.0, 3.0])),
    "not numbers": dict(body=with_input(data=["a", "b"])),
    "nan literal": dict(content=b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[NaN,1]}]}'),
    "overflows to inf": dict(body=with_input(data=[1e39, 1.0])),
    "inf via binary": binary_case(8, np.array([np.inf, 1], np.float32).tobytes()),
    "binary size mismatch": binary_case(4, b"\0\0\0\0"),
    "bad header length": dict(content=b"{}", headers={"Inference-Header-Content-Length": "99"}),
    "priority out of range": dict(body={**GOOD, "parameters": {"priority": 7}}),
    "negative timeout": dict(body={**GOOD, "parameters": {"timeout": -1}}),
    "unknown output": dict(body={**GOOD, "outputs": [{"name": "nope"}]}),
    "too large": dict(content=b"{" + b" " * 5000 + b"}"),
    # Triton's L0_http: 101 levels refused in its words, with or without NaN tokens
    "too deep": dict(content=b'{"inputs":' + b"[" * 100 + b"]" * 100 + b"}"),
    "too deep with nan": dict(content=b'{"x":NaN,"inputs":' + b"[" * 100 + b"]" * 100 + b"}"),
    "malformed nan json": dict(content=b'{"inputs":[{"name":"x","data":[NaN,1,]}]}'),
}


EXPECTED_WORDS = {
    "malformed json": "malformed JSON",
    "not an object": "JSON object",
    "no inputs": "non-empty list",
    "unknown input": "unknown input",
    "wrong shape": "unexpected shape for input 'x'",
    "batch too big": "batch-size must be <= 4",
    "wrong datatype": "datatype",
    "element count": "elements",
    "not numbers": "not a list of FP32",
    "nan literal": "NaN or Inf",  # parsed (Triton parity), then refused by the value check
    "overflows to inf": "NaN or Inf",
    "inf via binary": "NaN or Inf",
    "binary size mismatch": "bytes for shape",
    "bad header length": "body has",
    "priority out of range": "priority",
    "negative timeout": "timeout",
    "unknown output": "unexpected inference output 'nope' for model",
    "too large": "limit",
    "too deep": "JSON nesting depth exceeds maximum allowed limit (100)",
    "too deep with nan": "JSON nesting depth exceeds maximum allowed limit (100)",
    "malformed nan json": "malformed JSON",
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_gets_4xx_then_next_good_request_works(gated, case):
    url, engine, _ = gated
    before = len(engine.batches)
    r = post(url, **BAD_CASES[case])
    assert 400 <= r.status_code < 500, (case, r.status_code, r.text)
    assert EXPECTED_WORDS[case] in r.json()["error"]  # says what was wrong
    if case == "too large":
        assert r.status_code == 413
    assert len(engine.batches) == before  # never reached a batch
    ok = post(url, GOOD)
    assert ok.status_code == 200
    assert ok.json()["outputs"][0]["data"] == [2.0, 4.0]


def test_unknown_model_404(gated):
    url, _, _ = gated
    assert post(url, GOOD, path="nope").status_code == 404
    assert httpx.get(url + "/v2/models/nope").status_code == 404
    assert httpx.get(url + "/v2/models/gated/versions/7").status_code == 404


def test_bad_counts_show_in_metrics(gated):
    url, _, _ = gated
    post(url, content=b"{bad")
    text = httpx.get(url + "/metrics").text
    line = next(
        ln
        for ln in text.splitlines()
        if 'outcome="bad_request"' in ln and ln.startswith("wattserve_requests_total")
    )
    assert float(line.rsplit(" ", 1)[1]) >= 1


def test_queue_full_503_retry_after_and_deadline_503(gated):
    url, engine, _ = gated
    engine.gate.clear()
    engine.started.clear()

    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            first = asyncio.create_task(
                client.post(url + "/v2/models/gated/infer", json=with_input(data=[50.0, 0.0]))
            )
            await asyncio.to_thread(engine.started.wait, 10)
            queued = [asyncio.create_task(client.post(url + "/v2/models/gated/infer",
                                                      json=with_input(data=[60.0 + i, 0.0])))
                      for i in range(3)]  # fmt: skip
            await asyncio.sleep(0.5)
            full = await client.post(url + "/v2/models/gated/infer", json=GOOD)
            engine.gate.set()
            return full, await first, await asyncio.gather(*queued)

    try:
        full, first, queued = asyncio.run(scenario())
    finally:
        engine.gate.set()
    assert full.status_code == 503
    assert full.headers["retry-after"] == "2"
    assert first.status_code == 200
    assert [q.status_code for q in queued] == [200, 200, 200]

    engine.gate.clear()
    engine.started.clear()
    try:

        async def deadline():
            async with httpx.AsyncClient(timeout=30) as client:
                blocker = asyncio.create_task(client.post(url + "/v2/models/gated/infer", json=GOOD))
                await asyncio.to_thread(engine.started.wait, 10)
                body = {**with_input(data=[77.0, 0.0]), "parameters": {"timeout": 100_000}}
                timed = await client.post(url + "/v2/models/gated/infer", json=body)
                engine.gate.set()
                return timed, await blocker

        timed, blocker = asyncio.run(deadline())
    finally:
        engine.gate.set()
    assert timed.status_code == 503 and timed.json()["error"] == "Request timeout expired"
    assert blocker.status_code == 200
    time.sleep(0.1)
    assert 77.0 not in engine.seen


def test_client_that_goes_away_is_never_computed(gated):
    url, engine, app = gated
    engine.gate.clear()
    engine.started.clear()
    metrics = app.state.metrics

    async def scenario():
        async with httpx.AsyncClient(timeout=30) as client:
            blocker = asyncio.create_task(client.post(url + "/v2/models/gated/infer", json=GOOD))
            await asyncio.to_thread(engine.started.wait, 10)
            async with httpx.AsyncClient(timeout=0.3) as impatient:
                with pytest.raises(httpx.ReadTimeout):
                    await impatient.post(url + "/v2/models/gated/infer", json=with_input(data=[88.0, 0.0]))
            await asyncio.sleep(0.3)
            depth = app.state.runtime.batcher.queue_depth
            engine.gate.set()
            return depth, await blocker

    try:
        depth, blocker = asyncio.run(scenario())
    finally:
        engine.gate.set()
    assert depth == 0  # left the queue when the client left
    assert blocker.status_code == 200
    time.sleep(0.1)
    assert 88.0 not in engine.seen
    assert metrics.outcome["cancelled"]._value.get() >= 1


def test_unreadable_image_is_400_and_tensor_model_refuses_images(gated):
    url, _, _ = gated
    r = httpx.post(url + "/v2/models/gated/classify", files={"file": ("x.png", io.BytesIO(b"nope"))})
    assert r.status_code == 400
