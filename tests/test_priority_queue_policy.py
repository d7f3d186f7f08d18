"""Triton's ``dynamic_batching.priority_queue_policy``: a priority level's own queue policy
(timeout, timeout action, override, and a bound on that level's queued requests) in place
of ``default_queue_policy`` for that level's requests."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from tritonclient.utils import InferenceServerException
from wattserve.server.models.repository.config import ConfigError
from wattserve.server.models.repository.plan import plan_model
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

IDENTITY = """backend: "wattserve"
max_batch_size: 1
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "4" } }
parameters { key: "identity_delay_ms" value: { string_value: "400" } }
"""
LEVELS = """dynamic_batching {
  priority_levels: 3
  default_queue_policy { default_timeout_microseconds: 0 }
  priority_queue_policy { key: 2 value: { default_timeout_microseconds: 50000 } }
  priority_queue_policy { key: 3 value: { timeout_action: DELAY default_timeout_microseconds: 20000
                                          allow_timeout_override: true max_queue_size: 1 } }
}
"""


def write(root: Path, name: str, text: str) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(text)
    return root / name


def test_each_level_gets_its_own_policy(tmp_path):
    (plan,) = plan_model(write(tmp_path, "m", IDENTITY + LEVELS), Settings())
    queue = plan.serving.queue
    assert queue.at(1) is queue and queue.default_timeout_ms is None  # level 1: the default policy
    assert (queue.at(2).default_timeout_ms, queue.at(2).timeout_action, queue.at(2).max_queue_size) == (
        50.0,
        "reject",
        0,
    )
    three = queue.at(3)
    assert (
        three.default_timeout_ms,
        three.timeout_action,
        three.allow_timeout_override,
        three.max_queue_size,
    ) == (
        20.0,
        "delay",
        True,
        1,
    )
    bad = write(tmp_path, "bad", IDENTITY + LEVELS.replace("key: 3", "key: 4"))
    with pytest.raises(ConfigError, match=r"priority_queue_policy has level 4; the levels are 1..3"):
        plan_model(bad, Settings())


# Every request must reach the queue inside the first one's 400 ms (the level-3 ones in order,
# the second sent once the first is queued): alone, not beside another test
# (tests/serial_lock.py).
@pytest.mark.serial
def test_a_levels_timeout_and_bound_apply_to_its_requests_only_over_http_and_grpc(tmp_path):
    write(tmp_path, "levels", IDENTITY + LEVELS)
    port = free_port()
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False, grpc_port=port)) as (url, app):
        runtime = app.state.models.lookup("levels").runtime
        deadlines = {level: runtime.work_item({}, level, None) for level in (1, 2, 3)}
        assert deadlines[1].deadline is None  # no timeout at level 1
        assert deadlines[2].deadline - deadlines[2].arrival == pytest.approx(0.05)
        assert deadlines[3].delay_on_timeout and not deadlines[2].delay_on_timeout

        def over_http(priority: int) -> httpx.Response:
            body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [[1, 2, 3, 4]]}],
                    "parameters": {"priority": priority}}  # fmt: skip
            return httpx.post(f"{url}/v2/models/levels/infer", json=body, timeout=30)

        def over_grpc(priority: int) -> str:
            tensor = tgrpc.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
            try:
                tgrpc.InferenceServerClient(f"127.0.0.1:{port}").infer("levels", [tensor], priority=priority)
            except InferenceServerException as exc:
                return f"{exc.status()} {exc.message()}"
            return "ok"

        batcher = runtime.batcher

        def wait_until(condition, what: str) -> None:  # the server's own books, not a sleep
            deadline = time.monotonic() + 10
            while not condition():
                assert time.monotonic() < deadline, f"never: {what}"
                time.sleep(0.002)

        with ThreadPoolExecutor(6) as pool:
            busy = pool.submit(over_http, 1)  # holds the one instance for 400 ms
            wait_until(lambda: batcher.inflight == 1 and len(batcher.queue) == 0, "the first one running")
            level2_http, level2_grpc = pool.submit(over_http, 2), pool.submit(over_grpc, 2)
            level1 = pool.submit(over_http, 1)
            level3_first = pool.submit(over_http, 3)
            wait_until(lambda: batcher.queue.level_size(3) == 1, "the first level-3 request queued")
            level3_second = pool.submit(over_http, 3)  # level 3 holds one queued request at most
            assert busy.result().status_code == 200
            assert level1.result().status_code == 200  # level 1: no timeout, computed
            refused = level2_http.result()
            assert refused.status_code == 503 and "Request timeout expired" in refused.json()["error"]
            assert level2_grpc.result().startswith("StatusCode.UNAVAILABLE Request timeout expired")
            assert level3_first.result().status_code == 200  # DELAY: expired, still computed
            full = level3_second.result()
            assert full.status_code == 503 and "Exceeds maximum queue size" in full.json()["error"]
        doc = httpx.get(f"{url}/v2/models/levels/config").json()["dynamic_batching"]["priority_queue_policy"]
        assert doc["2"]["default_timeout_microseconds"] == 50000 and doc["3"]["timeout_action"] == "DELAY"
        assert doc["3"]["max_queue_size"] == 1
