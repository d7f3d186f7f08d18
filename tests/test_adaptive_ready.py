"""The adaptive batcher times its batch sizes before its model reports ready.

Its start-up timing (one batch of each probed size) ran inside the batching loop, after the
model had reported ready, so the first requests queued behind it (a live measurement had to
sleep 3 s after ready to be fair). The runtime now awaits the policy's ``prepare`` first."""

from __future__ import annotations

import httpx
from wattserve.server.settings import Settings

from tests.servers import threaded_server

BODY = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [0.0, 1.0, 2.0, 3.0]}]}


def test_ready_only_after_the_batch_sizes_were_timed() -> None:
    # 4 probed sizes x 150 ms: the timing outlasts the start-up by far
    settings = Settings(model="identity", identity_elements=4, identity_delay_ms=150.0, batcher="adaptive",
                        max_batch_size=8, slo_ms=2000, warmup=False)  # fmt: skip
    with threaded_server(settings) as (url, app):
        assert httpx.get(url + "/v2/health/ready").status_code == 200
        batcher = app.state.runtime.batcher
        snap = batcher.costs.snapshot()
        assert snap["intercept_s"] + snap["per_item_s"] * 8 > 0.1, snap  # seeded from the 150 ms batches
        r = httpx.post(url + "/v2/models/identity/infer", json=BODY, timeout=30)
        assert r.status_code == 200
        assert float(r.headers["x-queue-time-ms"]) < 100  # not queued behind the timing
