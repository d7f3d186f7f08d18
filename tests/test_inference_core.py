"""The protocol-neutral core under both front ends (server/core/): the one inference decode
harness, and both front ends refusing for the same reasons through it.

- ``InferenceDecoder``: a model being unloaded is refused before its body is read; the
  request comes back with the engine it was decoded for; the reader's budget reservation is
  released whether parsing succeeds or fails; payloads past ``OFFLOAD_DECODE_BYTES`` are
  parsed on a worker thread, smaller ones on the loop.
- A model that failed to load: HTTP answers 400, gRPC inference UNAVAILABLE (Triton's
  answers), with the same message; statistics of an unknown model: 404 / NOT_FOUND, same
  message.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.grpc as tgrpc
from prometheus_client import CollectorRegistry
from tritonclient.utils import InferenceServerException
from wattserve.batchers.status import Status
from wattserve.engines.registry import build_engine
from wattserve.server.core.admission import Refused
from wattserve.server.core.decode import OFFLOAD_DECODE_BYTES, BodyBudget, InferenceDecoder
from wattserve.server.core.request import BadRequest
from wattserve.server.http.codec import parse_infer_body
from wattserve.server.models.metrics import ServingMetrics
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.models.serving_config import ServingConfig
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

IDENTITY = {"model": "identity", "identity_elements": 4, "batcher": "dynamic", "max_batch_size": 4,
            "max_queue_delay_ms": 0, "telemetry": False, "warmup": False}  # fmt: skip
BODY = orjson.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)


def identity_runtime() -> ModelRuntime:
    settings = Settings(**IDENTITY)
    return ModelRuntime(ServingConfig.from_settings(settings), build_engine, ServingMetrics("identity", "dynamic", CollectorRegistry()),
                        name="identity")  # fmt: skip


def reader(budget: BodyBudget, held: int, calls: list[str]):
    """A front end's reader: the JSON body as the payload, ``held`` bytes reserved."""

    async def read(runtime, source):
        calls.append(source)
        budget.reserve(held)
        return (source, None), held, held

    return read


async def test_a_model_being_unloaded_is_refused_before_its_body_is_read():
    runtime = identity_runtime()  # not started: no engine, as after an unload cleared it
    budget, calls = BodyBudget(1 << 20), []
    decode = InferenceDecoder(reader(budget, 10, calls), parse_infer_body, budget, None)
    with pytest.raises(Refused) as refused:
        await decode(runtime, BODY)
    assert refused.value.status is Status.UNAVAILABLE
    assert refused.value.retry_after and refused.value.body_unread
    assert str(refused.value) == "model 'identity' is unloading"
    assert calls == [] and budget.used == 0


async def test_decoded_with_its_engine_and_the_budget_released_either_way():
    runtime = identity_runtime()
    await runtime.start()
    try:
        budget, calls = BodyBudget(1 << 20), []
        decode = InferenceDecoder(reader(budget, len(BODY), calls), parse_infer_body, budget, None)
        request, engine = await decode(runtime, BODY)
        assert engine is runtime.engine
        np.testing.assert_array_equal(request.inputs["INPUT0"], np.array([[1, 2, 3, 4]], np.float32))
        assert calls == [BODY] and budget.used == 0
        with pytest.raises(BadRequest, match="unknown input"):
            await decode(runtime, BODY.replace(b"INPUT0", b"NOPE"))
        assert budget.used == 0
    finally:
        await runtime.stop()


@pytest.mark.parametrize("held", [OFFLOAD_DECODE_BYTES, OFFLOAD_DECODE_BYTES + 1])
async def test_large_payloads_are_parsed_off_the_loop(held):
    runtime = identity_runtime()
    await runtime.start()
    try:
        threads: list[int] = []

        def parse(*args):
            threads.append(threading.get_ident())
            return parse_infer_body(*args)

        budget = BodyBudget(1 << 20)
        decode = InferenceDecoder(reader(budget, held, []), parse, budget, None)
        await decode(runtime, BODY)
        on_loop = threads == [threading.get_ident()]
        assert on_loop is (held <= OFFLOAD_DECODE_BYTES)
        assert budget.used == 0
    finally:
        await runtime.stop()


def test_both_front_ends_refuse_a_failed_model_and_an_unknown_one_alike(tmp_path: Path):
    import httpx

    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\nmax_batch_size: 4\n')
    (broken / "1" / "model.onnx").write_text("not an ONNX file")
    port = free_port()
    settings = Settings(**{**IDENTITY, "model_repository": tmp_path, "grpc_port": port})
    with threaded_server(settings) as (url, _):
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        answer = httpx.post(url + "/v2/models/broken/infer", content=BODY)
        assert answer.status_code == 400
        message = answer.json()["error"]
        assert message.startswith("model 'broken' is not available:")
        data = tgrpc.InferInput("INPUT0", [1, 4], "FP32")
        data.set_data_from_numpy(np.zeros((1, 4), np.float32))
        with pytest.raises(InferenceServerException) as err:
            client.infer("broken", [data])
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        assert err.value.message() == message

        answer = httpx.get(url + "/v2/models/nothing/stats")
        assert answer.status_code == 404
        with pytest.raises(InferenceServerException) as err:
            client.get_inference_statistics("nothing")
        assert err.value.status() == "StatusCode.NOT_FOUND"
        assert err.value.message() == answer.json()["error"]
        answer = httpx.get(url + "/v2/models/broken/stats")
        assert answer.status_code == 400
        with pytest.raises(InferenceServerException) as err:
            client.get_inference_statistics("broken")
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert err.value.message() == answer.json()["error"]
