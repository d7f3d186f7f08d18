"""Triton's model control modes, seen through Triton's own clients.

Where each behaviour comes from:
- none is the default; every model loads at start; load/unload answer UNAVAILABLE
  "explicit model load / unload is not allowed if polling is enabled" (HTTP 503, gRPC
  UNAVAILABLE): docs/user_guide/model_management.md "Model Control Mode NONE",
  qa/L0_http/python_http_aio_test.py and qa/L0_grpc/python_grpc_aio_test.py
  (test_load_model, test_unload_model), src/http_server.cc HttpCodeFromError.
- explicit: only --load-model models at start (none without it; the server is still ready);
  unknown model: "failed to load 'X', failed to poll from model repository":
  model_management.md "Model Control Mode EXPLICIT", qa/L0_lifecycle/lifecycle_test.py
  test_model_control.
- --load-model needs explicit mode: src/command_line_parser.cc (post-parse validation).
- poll: a new model directory loads, a removed one unloads, a changed config.pbtxt reloads,
  and client load/unload are refused: model_management.md "Model Control Mode POLL".
- zero-config (no repository, wattserve's own) serves its one model under the default.
"""

from __future__ import annotations

import shutil
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException
from wattserve.server.models.model_set import CONTROL_REFUSED
from wattserve.server.settings import Settings

from tests.conformance.tiny_models import ONNX_CONFIG, write_model
from tests.servers import free_port, threaded_server

BASE = {"torch_threads": 1, "telemetry": False, "warmup": False, "max_queue_delay_ms": 0}


def clients(url: str, app) -> tuple[thttp.InferenceServerClient, tgrpc.InferenceServerClient]:
    return (thttp.InferenceServerClient(url.removeprefix("http://")),
            tgrpc.InferenceServerClient(f"127.0.0.1:{app.state.grpc.port}"))  # fmt: skip


def add_one(client: thttp.InferenceServerClient, model: str) -> np.ndarray:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = thttp.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    out = client.infer(model, [tensor]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, x + 1)
    return out


@pytest.fixture
def repo(tmp_path):
    write_model(tmp_path, "a")
    write_model(tmp_path, "b")
    return tmp_path


def serve(repo, **settings):
    return threaded_server(Settings(model_repository=repo, grpc_port=free_port(), **BASE, **settings))


def test_none_is_the_default_loads_everything_and_refuses_load_and_unload(repo):
    assert Settings().model_control_mode == "none"
    with serve(repo) as (url, app):
        http, grpc = clients(url, app)
        assert http.is_model_ready("a") and http.is_model_ready("b")
        add_one(http, "a")
        for call in (http.load_model, http.unload_model):
            with pytest.raises(InferenceServerException, match=CONTROL_REFUSED) as info:
                call("a")
            assert info.value.status() == "503"
        for call in (grpc.load_model, grpc.unload_model):
            with pytest.raises(InferenceServerException, match=CONTROL_REFUSED) as info:
                call("a")
            assert info.value.status() == "StatusCode.UNAVAILABLE"
        # the refusal came before any change: still serving, and an override is refused too
        r = httpx.post(url + "/v2/repository/models/a/load", json={"parameters": {"config": "{}"}})
        assert r.status_code == 503 and r.json() == {"error": CONTROL_REFUSED}
        assert http.is_model_ready("a")
        add_one(http, "a")


def test_zero_config_model_serves_under_the_default_and_cannot_be_unloaded():
    with threaded_server(Settings(model="identity", grpc_port=free_port(), **BASE)) as (url, app):
        http, grpc = clients(url, app)
        assert http.is_server_ready() and http.is_model_ready("identity")
        with pytest.raises(InferenceServerException, match=CONTROL_REFUSED):
            grpc.unload_model("identity")
        assert http.is_model_ready("identity")


def test_explicit_without_load_model_loads_nothing_and_obeys_clients(repo):
    with serve(repo, model_control_mode="explicit") as (url, app):
        http, grpc = clients(url, app)
        assert http.is_server_live() and http.is_server_ready()  # ready with no model, as Triton
        assert not http.is_model_ready("a") and not grpc.is_model_ready("b")
        assert {m["name"] for m in http.get_model_repository_index()} == {"a", "b"}
        http.load_model("a")
        assert http.is_model_ready("a") and not http.is_model_ready("b")
        add_one(http, "a")
        grpc.load_model("b")
        assert grpc.is_model_ready("b")
        grpc.unload_model("a")
        assert not http.is_model_ready("a") and http.is_model_ready("b")
        for client in (http, grpc):
            with pytest.raises(InferenceServerException,
                               match="failed to load 'nope', failed to poll from model repository"):  # fmt: skip
                client.load_model("nope")


def test_explicit_with_load_model_loads_only_those(repo):
    with serve(repo, model_control_mode="explicit", load_model=["b"]) as (url, app):
        http, _ = clients(url, app)
        assert http.is_model_ready("b") and not http.is_model_ready("a")
    with serve(repo, model_control_mode="explicit", load_model=["*"]) as (url, app):  # today's behaviour
        http, _ = clients(url, app)
        assert http.is_model_ready("a") and http.is_model_ready("b")
        http.unload_model("a")
        assert not http.is_model_ready("a")


def test_load_model_needs_explicit_mode():
    with pytest.raises(ValueError, match="requires setting '--model-control-mode=explicit'"):
        Settings(load_model=["a"])
    with pytest.raises(ValueError, match=r"--load-model=\* must be the only"):
        Settings(model_control_mode="explicit", load_model=["*", "a"])


def wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the poller did not pick the change up in time"
        time.sleep(0.05)


def test_poll_loads_new_reloads_changed_and_unloads_removed_models(repo):
    with serve(repo, model_control_mode="poll", repository_poll_secs=0.2) as (url, app):
        http, grpc = clients(url, app)
        assert http.is_model_ready("a") and http.is_model_ready("b")
        with pytest.raises(InferenceServerException, match=CONTROL_REFUSED):
            grpc.load_model("a")

        write_model(repo, "c")  # a new model directory
        wait_for(lambda: http.is_model_ready("c"))
        add_one(http, "c")

        shutil.rmtree(repo / "b")  # a removed one: unloaded and gone from the index
        wait_for(lambda: "b" not in {m["name"] for m in http.get_model_repository_index()})
        assert not http.is_model_ready("b")

        (repo / "a" / "config.pbtxt").write_text(ONNX_CONFIG.replace("8", "2"))  # a changed config
        wait_for(lambda: http.is_model_ready("a") and http.get_model_config("a")["max_batch_size"] == 2)
        add_one(http, "a")
        assert app.state.models.poller.polls >= 3
