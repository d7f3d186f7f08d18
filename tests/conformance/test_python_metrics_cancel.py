"""A Python model's custom metrics on /metrics, and its requests' cancellation, end to end.

Where each behaviour comes from: python_backend README "Custom Metrics" (examples/
custom_metrics: a family per kind, ``Metric(labels=...)`` updated per request, read from
the server's metrics endpoint) and "Request Cancellation Handling" (``request.is_cancelled()``
and, for a decoupled model, ``response_sender.is_cancelled()``: Triton's qa/python_models/
execute_cancel loops until one says True). The models are real ``model.py`` files in a
repository built here (support/python_models.py), served by a real server on loopback and
reached with Triton's own clients; a client goes away by closing its socket (HTTP),
cancelling its call or its stream (gRPC).
"""

from __future__ import annotations

import json
import queue
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException
from wattserve.server.settings import Settings

from support.python_models import write_python_model
from tests.servers import free_port, threaded_server

BASE = {"telemetry": False, "warmup": False, "torch_threads": 1}
WAIT_S = 30.0  # the most a test waits for the server to reach a state it polls for


@pytest.fixture(scope="module", params=["process", "thread"])
def server(tmp_path_factory, request):
    """One server per Python model isolation mode: the same answers are expected of both."""
    repo = tmp_path_factory.mktemp("pb_metrics_repo")
    write_python_model(repo, "custom_metrics")
    write_python_model(repo, "cancel", policy="")
    write_python_model(
        repo, "cancel", name="cancel_stream", policy="model_transaction_policy { decoupled: true }"
    )
    write_python_model(repo, "add_sub")
    with threaded_server(
        Settings(model_repository=repo, grpc_port=free_port(), python_model_isolation=request.param, **BASE)
    ) as (url, app):
        http = thttp.InferenceServerClient(url.removeprefix("http://"))
        grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{app.state.grpc.port}")
        yield url, http, grpc


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of one /metrics scrape, parsed by prometheus_client's own parser."""
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(url: str, name: str, **labels: str) -> float | None:
    return samples(url).get((name, tuple(sorted(labels.items()))))


def wait_for(check: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        time.sleep(0.02)


def _input(module, name, array, datatype):
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def test_counter_gauge_histogram_after_requests_over_both_protocols(server):
    url, http, grpc = server
    labels = {"model": "custom_metrics", "version": "1"}
    sums = [0.5, 5.0, 50.0, 500.0, 3.0]  # one per bucket (<=1, <=10, <=100, +Inf), then 3
    for i, total in enumerate(sums):
        x = np.array([[total / 2, total / 2]], dtype=np.float32)
        client, module = ((http, thttp), (grpc, tgrpc))[i % 2]  # HTTP, gRPC, HTTP, ...
        result = client.infer("custom_metrics", [_input(module, "INPUT0", x, "FP32")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    got = samples(url)
    key = tuple(sorted(labels.items()))
    assert got[("pbm_requests", key)] == len(sums)
    assert got[("pbm_last_input_sum", key)] == 3.0
    assert got[("pbm_input_sum_count", key)] == len(sums)
    assert got[("pbm_input_sum_sum", key)] == pytest.approx(sum(sums))
    buckets = {le: got[("pbm_input_sum_bucket", tuple(sorted({**labels, "le": le}.items())))]
               for le in ("1", "10", "100", "+Inf")}  # fmt: skip  # bounds written as Triton writes them
    assert buckets == {"1": 1, "10": 3, "100": 4, "+Inf": 5}
    text = httpx.get(f"{url}/metrics").text  # Triton's help text and the models' own names
    assert "# HELP pbm_requests Requests this model executed" in text
    assert "# TYPE pbm_input_sum histogram" in text


def _raw_http_infer(url: str, model: str, wait: int) -> socket.socket:
    """Send one infer request on a socket of our own and leave it open (no answer read)."""
    body = json.dumps({"inputs": [{"name": "WAIT", "shape": [1], "datatype": "INT32", "data": [wait]}]})
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port))
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    sock.sendall(head.encode() + body.encode())
    return sock


def _wait_one(client, module, model="cancel"):
    return client.infer(model, [_input(module, "WAIT", np.array([0], np.int32), "INT32")])


def test_http_client_that_disconnects_cancels_the_running_request(server):
    url, http, _ = server
    before = value(url, "pbm_cancel_seen", how="request") or 0.0
    sock = _raw_http_infer(url, "cancel", wait=1)
    wait_for(lambda: value(url, "pbm_looping", model="cancel") == 1.0, "the model loops")
    # while it loops, other models answer
    a = np.ones(4, np.float32)
    result = http.infer("add_sub", [_input(thttp, "INPUT0", a, "FP32"), _input(thttp, "INPUT1", a, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    sock.close()  # the client goes away: is_cancelled() turns True, the model stops
    wait_for(lambda: value(url, "pbm_cancel_seen", how="request") == before + 1, "the model saw it")
    assert value(url, "pbm_looping", model="cancel") == 0.0
    assert _wait_one(http, thttp).as_numpy("OUT").tolist() == [0]  # its instance is free again


def test_grpc_call_cancelled_or_past_its_deadline_cancels_the_running_request(server):
    url, _, grpc = server
    before = value(url, "pbm_cancel_seen", how="request") or 0.0
    answers: queue.Queue = queue.Queue()
    wait = [_input(tgrpc, "WAIT", np.array([1], np.int32), "INT32")]
    call = grpc.async_infer("cancel", wait, callback=lambda result, error: answers.put(error))
    wait_for(lambda: value(url, "pbm_looping", model="cancel") == 1.0, "the model loops")
    call.cancel()
    wait_for(lambda: value(url, "pbm_cancel_seen", how="request") == before + 1, "the model saw the cancel")
    assert "CANCELLED" in str(answers.get(timeout=WAIT_S))
    # a client deadline: the call is cancelled on the server when it passes
    grpc.async_infer("cancel", wait, callback=lambda result, error: answers.put(error), client_timeout=1.0)
    wait_for(lambda: value(url, "pbm_cancel_seen", how="request") == before + 2, "the model saw the deadline")
    error = answers.get(timeout=WAIT_S)
    assert isinstance(error, InferenceServerException) and "Deadline" in str(error)
    assert _wait_one(grpc, tgrpc).as_numpy("OUT").tolist() == [0]


def test_decoupled_stream_cancelled_makes_the_response_sender_say_so(server):
    url, _, grpc = server
    before = value(url, "pbm_cancel_seen", how="sender") or 0.0
    answers: queue.Queue = queue.Queue()
    grpc.start_stream(callback=lambda result, error: answers.put((result, error)))
    grpc.async_stream_infer("cancel_stream", [_input(tgrpc, "WAIT", np.array([1], np.int32), "INT32")])
    first, error = answers.get(timeout=WAIT_S)  # its first response: the model is in its loop
    assert error is None and first.as_numpy("OUT").tolist() == [1]
    wait_for(lambda: value(url, "pbm_looping", model="cancel_stream") == 1.0, "the model loops")
    grpc.stop_stream(cancel_requests=True)
    wait_for(lambda: value(url, "pbm_cancel_seen", how="sender") == before + 1, "the sender said cancelled")
    assert value(url, "pbm_looping", model="cancel_stream") == 0.0


def test_generate_stream_client_that_leaves_makes_the_response_sender_say_so(server):
    url, _, _ = server
    before = value(url, "pbm_cancel_seen", how="sender") or 0.0
    with httpx.stream("POST", f"{url}/v2/models/cancel_stream/generate_stream", json={"WAIT": 1},
                      timeout=WAIT_S) as answer:  # fmt: skip
        assert answer.status_code == 200
        lines = answer.iter_lines()  # kept: closing this iterator would close the connection
        first = next(lines)
        assert json.loads(first.removeprefix("data: "))["OUT"] == 1
        wait_for(lambda: value(url, "pbm_looping", model="cancel_stream") == 1.0, "the model loops")
    # the connection closed before the final response (Server-Sent Events over HTTP)
    wait_for(lambda: value(url, "pbm_cancel_seen", how="sender") == before + 1, "the sender said cancelled")
