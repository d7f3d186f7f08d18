"""Triton's ``dynamic_batching.preserve_ordering``: answers leave in the order their requests
arrived, even when a later request finishes first on another instance. A Python model that
sleeps as long as its input says, on two instances: a slow request, then a fast one."""

from __future__ import annotations

import queue
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as tgrpc
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

SLEEPER = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy()
            time.sleep(float(seconds.ravel()[0]))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", seconds)]))
        return out
"""
CONFIG = """backend: "python"
max_batch_size: 1
input [ { name: "SECONDS" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { %s }
"""


def write(root: Path, name: str, batching: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(SLEEPER)
    (root / name / "config.pbtxt").write_text(CONFIG % batching)


def test_answers_leave_in_arrival_order_over_http_and_grpc(tmp_path):
    write(tmp_path, "ordered", "preserve_ordering: true")
    write(tmp_path, "unordered", "")  # the control: the fast answer overtakes
    port = free_port()
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False, grpc_port=port)) as (url, _):
        # gRPC: one stream carries both answers, in the order the server gave them
        for model, expected in (("ordered", [0.8, 0.0]), ("unordered", [0.0, 0.8])):
            answers: queue.Queue = queue.Queue()
            client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
            client.start_stream(callback=lambda result, error, sink=answers: sink.put((result, error)))
            for seconds in (0.8, 0.0):
                tensor = tgrpc.InferInput("SECONDS", [1, 1], "FP32")
                tensor.set_data_from_numpy(np.array([[seconds]], np.float32))
                client.async_stream_infer(model, [tensor])
                time.sleep(0.2)  # the slow one is computing on one instance when the fast one comes
            got = []
            for _ in range(2):
                result, error = answers.get(timeout=30)
                assert error is None, error
                got.append(round(float(result.as_numpy("OUT").ravel()[0]), 3))
            client.stop_stream()
            assert got == expected, model

        # HTTP: the fast request's answer cannot leave before the slow one's compute ends
        def over_http(seconds: float) -> float:
            body = {"inputs": [{"name": "SECONDS", "shape": [1, 1], "datatype": "FP32", "data": [[seconds]]}]}
            r = httpx.post(f"{url}/v2/models/ordered/infer", json=body, timeout=30)
            assert r.status_code == 200, r.text
            return time.monotonic()

        with ThreadPoolExecutor(2) as pool:
            t0 = time.monotonic()
            slow = pool.submit(over_http, 0.8)
            time.sleep(0.2)
            fast = pool.submit(over_http, 0.0)
            assert fast.result() - t0 >= 0.8  # a lower bound only: the slow one sleeps 0.8 s
            slow.result()
