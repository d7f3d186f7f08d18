"""KServe v2 over gRPC against live servers on loopback, with Triton's own gRPC client
(``tritonclient.grpc``, sync, asyncio and streaming) unmodified, and the generated stub
where a test needs what the client hides (typed contents, trailing metadata)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.grpc.aio as tgrpc_aio
import tritonclient.http as thttp
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException
from wattserve.server.settings import Settings

from tests.gated_engine import GatedEngine
from tests.servers import free_port, server_process, threaded_server

IDENTITY = dict(model="identity", identity_elements=16, batcher="dynamic", max_batch_size=8,
                max_queue_delay_ms=1, telemetry=False)  # fmt: skip


@pytest.fixture(scope="module")
def identity():
    """(http url, grpc address, app) of an identity server speaking both protocols."""
    port = free_port()
    with threaded_server(Settings(**IDENTITY, grpc_port=port)) as (url, app):
        yield url, f"127.0.0.1:{port}", app


@pytest.fixture(scope="module")
def gated():
    """A server whose engine computes only when the test opens its gate."""
    engine = GatedEngine(max_batch_size=4)
    port = free_port()
    settings = Settings(model="gated", batcher="dynamic", max_batch_size=4, max_queue_delay_ms=0,
                        max_queue_size=3, max_queue_wait_s=0, retry_after_s=2, check_values=True,
                        telemetry=False, grpc_port=port)  # fmt: skip
    with threaded_server(settings, engine_factory=lambda s: engine) as (url, app):
        yield url, f"127.0.0.1:{port}", engine, app


def stub(address: str) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address))


def gated_request(value: float, rid: str = "", shape=(1, 2), **parameters) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="gated", id=rid)
    request.inputs.add(name="x", datatype="FP32", shape=list(shape))
    request.raw_input_contents.append(np.array([[value, -value]], np.float32).tobytes())
    for key, v in parameters.items():
        request.parameters[key].int64_param = v
    return request


def identity_input(data: np.ndarray, module=tgrpc):
    tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return tensor


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


# ------------------------------------------------------------------ health, metadata, config, stats
def test_health_metadata_config_and_stats_equal_http(identity):
    url, address, _ = identity
    client = tgrpc.InferenceServerClient(address)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("identity")
    assert not client.is_model_ready("nope")  # unknown: not ready, as Triton answers
    meta = client.get_server_metadata()
    assert meta.name == "wattserve" and "model_repository" in meta.extensions

    model = client.get_model_metadata("identity", as_json=True)
    assert model == {**httpx.get(url + "/v2/models/identity").json(),
                     "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "16"]}],
                     "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": ["-1", "16"]}]}  # fmt: skip

    http_config = json_format.ParseDict(httpx.get(url + "/v2/models/identity/config").json(),
                                        model_config_pb2.ModelConfig())  # fmt: skip
    assert client.get_model_config("identity").config == http_config
    assert http_config.dynamic_batching.max_queue_delay_microseconds == 1000

    data = np.ones((3, 16), np.float32)
    client.infer("identity", [identity_input(data)])
    http_stats = httpx.get(url + "/v2/models/identity/stats").json()
    grpc_stats = client.get_inference_statistics("identity")
    assert grpc_stats == json_format.ParseDict(http_stats, service_pb2.ModelStatisticsResponse())
    assert grpc_stats.model_stats[0].inference_count >= 3
    assert client.get_inference_statistics("") == grpc_stats  # every model: the one there is

    index = client.get_model_repository_index()
    assert [(m.name, m.version, m.state) for m in index.models] == [("identity", "1", "READY")]
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("nope")
    assert err.value.status() == "StatusCode.NOT_FOUND"


# ------------------------------------------------------------------ inference
def test_infer_sync_equals_http(identity):
    url, address, _ = identity
    rng = np.random.default_rng(0)
    data = rng.standard_normal((4, 16)).astype(np.float32)
    result = tgrpc.InferenceServerClient(address).infer(
        "identity", [identity_input(data)], request_id="g-1", priority=1, timeout=5_000_000
    )
    http_in = thttp.InferInput("INPUT0", [4, 16], "FP32")
    http_in.set_data_from_numpy(data, binary_data=True)
    http_result = thttp.InferenceServerClient(url.removeprefix("http://")).infer("identity", [http_in])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), http_result.as_numpy("OUTPUT0"))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("g-1", "identity", "1")


def test_a_grpc_request_is_looked_up_and_its_room_checked_once(identity, monkeypatch):
    """gRPC selects the runtime from the wire header (before parsing) and admits that one:
    the model set is asked once per request, unary and streamed."""
    _, address, app = identity
    models = app.state.models
    lookups: list[str] = []
    real_lookup = models.lookup

    def counting_lookup(name, version=None):
        lookups.append(name)
        return real_lookup(name, version)

    monkeypatch.setattr(models, "lookup", counting_lookup)
    data = np.ones((1, 16), np.float32)
    client = tgrpc.InferenceServerClient(address)
    np.testing.assert_array_equal(client.infer("identity", [identity_input(data)]).as_numpy("OUTPUT0"), data)
    assert lookups == ["identity"]
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer("identity", [identity_input(data)], request_id="s-1")
        result, error = answers.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None and result.get_response().id == "s-1"
    assert lookups == ["identity", "identity"]


def test_typed_contents_answer_like_raw_contents(identity):
    _, address, _ = identity
    data = np.arange(16, dtype=np.float32).reshape(1, 16) / 7
    request = service_pb2.ModelInferRequest(model_name="identity")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    tensor.contents.fp32_contents.extend(data.ravel().tolist())
    response, call = stub(address).ModelInfer.with_call(request)
    out = response.outputs[0]
    assert (out.name, out.datatype, list(out.shape)) == ("OUTPUT0", "FP32", [1, 16])
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], np.float32), data.ravel())
    trailers = dict(call.trailing_metadata())
    assert int(trailers["x-batch-size"]) >= 1 and "x-queue-time-ms" in trailers


def test_asyncio_client_concurrent_requests(identity):
    _, address, _ = identity

    async def run() -> list[np.ndarray]:
        async with tgrpc_aio.InferenceServerClient(address) as client:
            calls = [client.infer("identity", [identity_input(np.full((1, 16), i, np.float32), tgrpc_aio)])
                     for i in range(16)]  # fmt: skip
            return [r.as_numpy("OUTPUT0") for r in await asyncio.gather(*calls)]

    outputs = asyncio.run(run())
    for i, out in enumerate(outputs):  # each answer from its own input, whatever batch it rode in
        np.testing.assert_array_equal(out, np.full((1, 16), i, np.float32))


def test_stream_answers_every_request_with_its_id(identity):
    _, address, _ = identity
    client = tgrpc.InferenceServerClient(address)
    answers: dict[str, np.ndarray] = {}
    errors: list[str] = []
    done = threading.Event()

    def callback(result, error):
        if error is not None:
            errors.append(str(error))
        else:
            answers[result.get_response().id] = result.as_numpy("OUTPUT0")
        if len(answers) + len(errors) == 21:
            done.set()

    client.start_stream(callback)
    try:
        for i in range(20):
            client.async_stream_infer("identity", [identity_input(np.full((1, 16), i, np.float32))],
                                      request_id=f"s-{i}")  # fmt: skip
        bad = tgrpc.InferInput("INPUT0", [1, 15], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 15), np.float32))
        client.async_stream_infer("identity", [bad], request_id="s-bad")  # refused; the stream goes on
        assert done.wait(30)
    finally:
        client.stop_stream()
    assert sorted(answers) == sorted(f"s-{i}" for i in range(20))
    for i in range(20):
        np.testing.assert_array_equal(answers[f"s-{i}"], np.full((1, 16), i, np.float32))
    assert len(errors) == 1 and "got [1, 15]" in errors[0]


@pytest.mark.slow
def test_mobilenet_answers_equal_over_both_protocols():
    """A real torch model (random weights): the same input gives the same output whether it
    came over HTTP (binary) or gRPC."""
    port = free_port()
    settings = Settings(model="mobilenet_v2", batcher="dynamic", max_batch_size=2, max_queue_delay_ms=1,
                        telemetry=False, grpc_port=port)  # fmt: skip
    with threaded_server(settings) as (url, _app):
        data = np.random.default_rng(1).standard_normal((2, 3, 224, 224)).astype(np.float32)
        g_in = tgrpc.InferInput("input", [2, 3, 224, 224], "FP32")
        g_in.set_data_from_numpy(data)
        grpc_out = tgrpc.InferenceServerClient(f"127.0.0.1:{port}").infer("mobilenet_v2", [g_in])
        h_in = thttp.InferInput("input", [2, 3, 224, 224], "FP32")
        h_in.set_data_from_numpy(data, binary_data=True)
        http_out = thttp.InferenceServerClient(url.removeprefix("http://")).infer("mobilenet_v2", [h_in])
        name = grpc_out.get_response().outputs[0].name
        np.testing.assert_allclose(grpc_out.as_numpy(name), http_out.as_numpy(name), atol=1e-5)
        assert grpc_out.as_numpy(name).shape == (2, 1000)


# ------------------------------------------------------------------ refusals
def _bad(shape=(1, 2), datatype="FP32", raw=None, name="x", model="gated", extra_raw=False):
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype=datatype, shape=list(shape))
    request.raw_input_contents.append(raw if raw is not None else np.zeros(shape, np.float32).tobytes())
    if extra_raw:
        request.raw_input_contents.append(b"")
    return request


BAD = {
    "wrong shape": (_bad(shape=(1, 3)), grpc.StatusCode.INVALID_ARGUMENT, "expected [-1, 2], got [1, 3]"),
    "batch too big": (_bad(shape=(5, 2)), grpc.StatusCode.INVALID_ARGUMENT, "batch-size must be <= 4"),
    "wrong datatype": (_bad(datatype="FP64"), grpc.StatusCode.INVALID_ARGUMENT, "model expects FP32"),
    "byte count": (_bad(raw=b"\0" * 12), grpc.StatusCode.INVALID_ARGUMENT, "12 bytes for shape [1, 2]"),
    "unknown input": (_bad(name="z"), grpc.StatusCode.INVALID_ARGUMENT, "unknown input 'z'"),
    "raw count": (_bad(extra_raw=True), grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents has 2"),
    "nan checked": (
        _bad(raw=np.array([[np.nan, 1]], np.float32).tobytes()),
        grpc.StatusCode.INVALID_ARGUMENT,
        "NaN or Inf",
    ),
    "unknown model": (
        _bad(model="nope"),
        grpc.StatusCode.NOT_FOUND,
        "Request for unknown model: 'nope' is not found",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inputs_get_the_status_code_triton_gives(gated, case):
    _, address, engine, _ = gated
    request, code, text = BAD[case]
    before = len(engine.batches)
    with pytest.raises(grpc.RpcError) as err:
        stub(address).ModelInfer(request)
    assert err.value.code() == code
    assert text in err.value.details()
    assert len(engine.batches) == before  # refused before any queue


def test_queue_full_is_unavailable_with_retry_info_and_timeout_is_tritons_unavailable(gated):
    _, address, engine, app = gated
    engine.gate.clear()
    engine.started.clear()
    client = stub(address)
    pool = concurrent.futures.ThreadPoolExecutor(4)
    try:
        first = pool.submit(client.ModelInfer, gated_request(1.0))
        assert engine.started.wait(10)
        # queued with a 200 ms timeout (Triton's parameter, µs): never computed, Triton's
        # UNAVAILABLE "Request timeout expired"
        with pytest.raises(grpc.RpcError) as late:
            client.ModelInfer(gated_request(2.0, timeout=200_000))
        assert late.value.code() == grpc.StatusCode.UNAVAILABLE
        assert late.value.details() == "Request timeout expired"
        queued = [pool.submit(client.ModelInfer, gated_request(3.0 + i)) for i in range(3)]
        wait_for(lambda: app.state.runtime.batcher.queue_depth == 3)
        with pytest.raises(grpc.RpcError) as full:
            client.ModelInfer(gated_request(9.0))
        assert full.value.code() == grpc.StatusCode.UNAVAILABLE
        trailers = dict(full.value.trailing_metadata())
        assert trailers["retry-after"] == "2" and trailers["grpc-retry-pushback-ms"] == "2000"
    finally:
        engine.gate.set()
    assert first.result(10).outputs[0].name == "y"
    assert all(f.result(10) for f in queued)
    pool.shutdown()
    assert 2.0 not in engine.seen and 9.0 not in engine.seen


def test_client_that_cancels_mid_queue_costs_no_compute(gated):
    _, address, engine, app = gated
    engine.gate.clear()
    engine.started.clear()
    client = tgrpc.InferenceServerClient(address)
    metrics = app.state.runtime.metrics
    cancelled_before = metrics._outcomes["grpc"]["cancelled"]._value.get()
    answers: list = []
    try:
        blocker = client.async_infer(
            "gated", [_gated_input(41.0)], callback=lambda result, error: answers.append((result, error))
        )
        assert engine.started.wait(10)
        # a gRPC deadline that passes while queued: the client gives up, the handler is cancelled
        with pytest.raises(InferenceServerException) as err:
            client.infer("gated", [_gated_input(42.0)], client_timeout=0.3)
        assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        wait_for(lambda: app.state.runtime.batcher.queue_depth == 0)  # it left the queue
        # an explicit cancel of a queued call
        call = client.async_infer("gated", [_gated_input(43.0)], callback=lambda result, error: None)
        wait_for(lambda: app.state.runtime.batcher.queue_depth == 1)
        call.cancel()
        wait_for(lambda: app.state.runtime.batcher.queue_depth == 0)
    finally:
        engine.gate.set()
    wait_for(lambda: len(answers) == 1)
    assert answers[0][1] is None
    time.sleep(0.1)
    assert 41.0 in engine.seen
    assert 42.0 not in engine.seen and 43.0 not in engine.seen  # never computed
    wait_for(lambda: metrics._outcomes["grpc"]["cancelled"]._value.get() >= cancelled_before + 2)
    blocker.cancel()


def _gated_input(value: float):
    tensor = tgrpc.InferInput("x", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[value, -value]], np.float32))
    return tensor


# ------------------------------------------------------------------ one batcher, two protocols
def test_one_batch_mixes_http_and_grpc_requests(gated):
    url, address, engine, app = gated
    engine.gate.clear()
    engine.started.clear()
    client = tgrpc.InferenceServerClient(address)
    results: dict[float, np.ndarray] = {}

    def on_answer(value):
        return lambda result, error: results.__setitem__(value, result.as_numpy("y") if result else error)

    def http(value: float) -> None:
        body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [value, -value]}]}
        results[value] = np.array(httpx.post(url + "/v2/models/gated/infer", json=body, timeout=30)
                                  .json()["outputs"][0]["data"], np.float32).reshape(1, 2)  # fmt: skip

    threads = []
    try:
        threads.append(threading.Thread(target=http, args=(100.0,)))  # occupies the engine
        threads[0].start()
        assert engine.started.wait(10)
        client.async_infer("gated", [_gated_input(201.0)], callback=on_answer(201.0))
        threads.append(threading.Thread(target=http, args=(102.0,)))
        threads[1].start()
        client.async_infer("gated", [_gated_input(203.0)], callback=on_answer(203.0))
        wait_for(lambda: app.state.runtime.batcher.queue_depth == 3)
    finally:
        engine.gate.set()
    for t in threads:
        t.join(30)
    wait_for(lambda: len(results) == 4)
    mixed = [b for b in engine.batches if {201.0, 102.0, 203.0} <= set(b)]
    assert mixed, f"no batch held both protocols' requests: {engine.batches[-3:]}"
    for value, out in results.items():  # each answer from its own row
        np.testing.assert_array_equal(out, np.array([[2 * value, -2 * value]], np.float32))


def test_request_metrics_carry_the_protocol(identity):
    url, address, _ = identity
    client = tgrpc.InferenceServerClient(address)
    text_before = httpx.get(url + "/metrics").text
    client.infer("identity", [identity_input(np.zeros((1, 16), np.float32))])
    streamed = threading.Event()
    client.start_stream(lambda result, error: streamed.set())
    client.async_stream_infer("identity", [identity_input(np.zeros((1, 16), np.float32))])
    assert streamed.wait(10)
    client.stop_stream()
    text = httpx.get(url + "/metrics").text

    def value(text: str, series: str) -> float:
        lines = [ln for ln in text.splitlines() if ln.startswith(series + " ")]
        return float(lines[0].split()[-1]) if lines else 0.0

    grpc_ok = 'wattserve_requests_total{batcher="dynamic",model="identity",outcome="success",protocol="grpc"}'
    assert value(text, grpc_ok) == value(text_before, grpc_ok) + 2  # unary and streamed
    assert (
        'wattserve_request_duration_seconds_count{batcher="dynamic",model="identity",protocol="grpc"}' in text
    )
    assert 'protocol="http"' in text


# ------------------------------------------------------------------ access control, drain
def test_restricted_apis_and_bearer_token_read_grpc_metadata():
    port = free_port()
    settings = Settings(**IDENTITY, grpc_port=port, api_token="t0ken",
                        restricted_api="model-repository,statistics:admin-key=s3cret")  # fmt: skip
    with threaded_server(settings):
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_live()  # health is open
        with pytest.raises(InferenceServerException) as err:
            client.get_inference_statistics("identity")
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        assert "triton-grpc-protocol-admin-key" in err.value.message()
        for key in ("triton-grpc-protocol-admin-key", "admin-key"):
            assert client.get_inference_statistics("identity", headers={key: "s3cret"}).model_stats
        with pytest.raises(InferenceServerException) as err:
            client.get_model_repository_index(headers={"admin-key": "wrong"})
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        data = [identity_input(np.zeros((1, 16), np.float32))]
        with pytest.raises(InferenceServerException) as err:
            client.infer("identity", data)
        assert err.value.status() == "StatusCode.UNAUTHENTICATED"
        assert (
            client.infer("identity", data, headers={"authorization": "Bearer t0ken"}).as_numpy("OUTPUT0")
            is not None
        )


def test_sigterm_drains_grpc_work_then_stops():
    port = free_port()
    env = {"WATTSERVE_MODEL": "identity", "WATTSERVE_IDENTITY_ELEMENTS": "16", "WATTSERVE_IDENTITY_DELAY_MS": "600",
           "WATTSERVE_BATCHER": "dynamic", "WATTSERVE_MAX_BATCH_SIZE": "1", "WATTSERVE_GRPC_PORT": str(port),
           "WATTSERVE_TELEMETRY": "false", "WATTSERVE_WARMUP": "false"}  # fmt: skip
    with server_process(env) as proc:
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        answers: list = []
        for i in range(2):  # one computing, one queued when the signal comes
            client.async_infer("identity", [identity_input(np.full((1, 16), i, np.float32))],
                               callback=lambda result, error: answers.append((result, error)))  # fmt: skip
        time.sleep(0.2)
        proc.terminate()
        time.sleep(0.2)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("identity", [identity_input(np.zeros((1, 16), np.float32))])
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        wait_for(lambda: len(answers) == 2, timeout=20)
        assert all(e is None for _, e in answers), answers
        assert proc.proc.wait(30) == 0


def test_engine_failure_is_internal_and_fails_only_that_request(gated):
    _, address, engine, _ = gated
    engine.poison = 77.0
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub(address).ModelInfer(gated_request(77.0))
        assert err.value.code() == grpc.StatusCode.INTERNAL
        assert stub(address).ModelInfer(gated_request(5.0)).outputs[0].name == "y"  # still serving
    finally:
        engine.poison = None


def test_stream_refusal_carries_the_request_id(gated):
    _, address, _, _ = gated
    requests = [gated_request(6.0, rid="ok"), _bad(shape=(1, 3)), gated_request(7.0, rid="ok-2")]
    requests[1].id = "bad"
    answers = {a.infer_response.id: a for a in stub(address).ModelStreamInfer(iter(requests), timeout=30)}
    assert sorted(answers) == ["bad", "ok", "ok-2"]
    assert "expected [-1, 2], got [1, 3]" in answers["bad"].error_message
    assert not answers["ok"].error_message
    out = np.frombuffer(answers["ok-2"].infer_response.raw_output_contents[0], np.float32)
    np.testing.assert_array_equal(out, [14.0, -14.0])


def test_stream_cancelled_mid_queue_costs_no_compute(gated):
    _, address, engine, app = gated
    engine.gate.clear()
    engine.started.clear()
    pending: queue.Queue = queue.Queue()

    def requests():
        while (request := pending.get()) is not None:
            yield request

    channel = grpc.insecure_channel(address)
    call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests())
    try:
        pending.put(gated_request(61.0, rid="a"))
        assert engine.started.wait(10)
        pending.put(gated_request(62.0, rid="b"))
        wait_for(lambda: app.state.runtime.batcher.queue_depth == 1)
        call.cancel()  # the client goes away with one request computing and one queued
        wait_for(lambda: app.state.runtime.batcher.queue_depth == 0)
    finally:
        engine.gate.set()
        pending.put(None)
    time.sleep(0.2)
    assert 61.0 in engine.seen
    assert 62.0 not in engine.seen  # never computed
    channel.close()
