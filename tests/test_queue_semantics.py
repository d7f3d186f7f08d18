"""A wattserve default never undercuts a repository config: Triton's queue semantics.

Triton bounds a queued request's wait only by its config (``max_queue_delay_microseconds``
and the queue policy's timeouts); L0_batcher sets a 10 s delay and expects the batch
computed. wattserve's own time bound (``max_queue_wait_s``, 3 s) therefore applies to a
repository model only when the user sets it: for the process, or in the model's parameters.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as tgrpc
from wattserve.engines.registry import build_engine
from wattserve.server.models.plan import SettingsSource
from wattserve.server.models.repository.plan import plan_model
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

DELAY_US = 3_500_000  # longer than the default bound of 3 s: the old code answered 503

IDENTITY = """backend: "wattserve"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: %d }
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "4" } }
"""


def write(root: Path, name: str, text: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(text)
    return root / name


def test_repository_models_get_no_time_bound_unless_the_user_sets_one(tmp_path, monkeypatch):
    monkeypatch.delenv("WATTSERVE_MAX_QUEUE_WAIT_S", raising=False)
    model = write(tmp_path, "m", IDENTITY % DELAY_US)
    (plan,) = plan_model(model, Settings())
    assert plan.serving.batching.max_queue_wait_s == 0.0  # Triton's: only the config bounds a wait
    assert plan.serving.batching.max_queue_delay_ms == DELAY_US / 1000
    (explicit,) = plan_model(model, Settings(max_queue_wait_s=2.5))  # the user's own bound is kept
    assert explicit.serving.batching.max_queue_wait_s == 2.5
    monkeypatch.setenv("WATTSERVE_MAX_QUEUE_WAIT_S", "4")
    (from_env,) = plan_model(model, Settings())
    assert from_env.serving.batching.max_queue_wait_s == 4.0
    pinned = write(tmp_path, "p", IDENTITY % DELAY_US + 'parameters { key: "max_queue_wait_s" '
                   'value: { string_value: "1.5" } }\n')  # fmt: skip
    (per_model,) = plan_model(pinned, Settings(max_queue_wait_s=2.5))
    assert per_model.serving.batching.max_queue_wait_s == 1.5


def test_zero_config_models_keep_the_default_bound(monkeypatch):
    monkeypatch.delenv("WATTSERVE_MAX_QUEUE_WAIT_S", raising=False)
    settings = Settings(model="identity")
    (plan,) = SettingsSource(settings, build_engine).plans("identity")
    assert plan.serving.batching.max_queue_wait_s == 3.0


def test_a_long_queue_delay_is_computed_over_http_and_grpc(tmp_path, monkeypatch):
    """L0_batcher's shape: a delay longer than the default bound. Both protocols' requests
    wait it out and share one batch; a model whose parameters set wattserve's bound below
    the delay (the control) gets the bound's 503, so the bound is still enforced when asked."""
    monkeypatch.delenv("WATTSERVE_MAX_QUEUE_WAIT_S", raising=False)
    write(tmp_path, "patient", IDENTITY % DELAY_US)
    write(tmp_path, "bounded", IDENTITY % DELAY_US + 'parameters { key: "max_queue_wait_s" '
          'value: { string_value: "1" } }\n')  # fmt: skip
    port = free_port()
    settings = Settings(model_repository=tmp_path, telemetry=False, grpc_port=port)
    with threaded_server(settings) as (url, _):
        http_data = [[1.0, 2.0, 3.0, 4.0]]
        grpc_data = np.array([[5.0, 6.0, 7.0, 8.0]], dtype=np.float32)

        def over_http(model: str) -> httpx.Response:
            body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": http_data}]}
            return httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)

        def over_grpc() -> np.ndarray:
            tensor = tgrpc.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(grpc_data)
            result = tgrpc.InferenceServerClient(f"127.0.0.1:{port}").infer("patient", [tensor])
            return result.as_numpy("OUTPUT0")

        with ThreadPoolExecutor(3) as pool:
            http = pool.submit(over_http, "patient")
            grpc = pool.submit(over_grpc)
            bounded = pool.submit(over_http, "bounded")
            ok, grpc_out, refused = http.result(), grpc.result(), bounded.result()
        assert ok.status_code == 200, ok.text
        assert ok.json()["outputs"][0]["data"] == http_data[0]
        np.testing.assert_array_equal(grpc_out, grpc_data)
        assert refused.status_code == 503 and "max_queue_wait_s" in refused.json()["error"]
        stats = httpx.get(f"{url}/v2/models/patient/stats").json()["model_stats"][0]
        assert stats["inference_count"] == 2 and stats["execution_count"] == 1  # one batch of both
