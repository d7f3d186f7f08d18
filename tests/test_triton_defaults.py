"""Triton's defaults for what a config leaves out: no ``dynamic_batching`` is no batching
across requests (Triton's default scheduler), no ``instance_group`` is one instance per
visible GPU (one on a CPU-only host), KIND_GPU without ``gpus`` is every visible GPU."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from wattserve.server.models.repository import plan as plan_module
from wattserve.server.models.repository.config import ConfigError
from wattserve.server.models.repository.plan import plan_model
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

IDENTITY = """backend: "wattserve"
max_batch_size: 8
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "4" } }
parameters { key: "identity_delay_ms" value: { string_value: "150" } }
"""
ONNX = """platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def write(root: Path, name: str, text: str, file: str | None = None) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(text)
    if file:
        (root / name / "1" / file).write_bytes(b"")  # planned only: the engine is never built
    return root / name


def test_without_dynamic_batching_each_request_is_its_own_execution(tmp_path, monkeypatch):
    monkeypatch.delenv("WATTSERVE_BATCHER", raising=False)
    alone = write(tmp_path, "alone", IDENTITY)
    batched = write(tmp_path, "batched", IDENTITY + "dynamic_batching { }\n")
    pinned = write(
        tmp_path, "pinned", IDENTITY + 'parameters { key: "batcher" value: { string_value: "static" } }\n'
    )
    assert plan_model(alone, Settings())[0].serving.batching.batcher == "single"
    assert plan_model(batched, Settings())[0].serving.batching.batcher == "dynamic"
    assert plan_model(pinned, Settings())[0].serving.batching.batcher == "static"  # the user's choice
    monkeypatch.setenv("WATTSERVE_BATCHER", "continuous")  # the user's choice for every model
    assert plan_model(alone, Settings())[0].serving.batching.batcher == "continuous"


def test_unbatched_and_batched_models_over_http_and_grpc(tmp_path, monkeypatch):
    """Four concurrent requests (two HTTP, two gRPC) each: without dynamic_batching four
    executions of one request; with it (preferred size 4, the control) fewer, shared."""
    monkeypatch.delenv("WATTSERVE_BATCHER", raising=False)
    write(tmp_path, "alone", IDENTITY)
    write(tmp_path, "batched", IDENTITY + "dynamic_batching { preferred_batch_size: [ 4 ] "
          "max_queue_delay_microseconds: 2000000 }\n")  # fmt: skip
    port = free_port()
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False, grpc_port=port)) as (url, _):
        for model in ("alone", "batched"):

            def over_http(i: int, model: str = model) -> tuple[list[float], str]:
                data = [float(i)] * 4
                body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [data]}]}
                r = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)
                assert r.status_code == 200, r.text
                assert r.json()["outputs"][0]["data"] == data
                return data, r.headers["X-Batch-Size"]

            def over_grpc(i: int, model: str = model) -> None:
                data = np.full((1, 4), float(i), np.float32)
                tensor = tgrpc.InferInput("INPUT0", [1, 4], "FP32")
                tensor.set_data_from_numpy(data)
                result = tgrpc.InferenceServerClient(f"127.0.0.1:{port}").infer(model, [tensor])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)

            with ThreadPoolExecutor(4) as pool:
                http = [pool.submit(over_http, i) for i in (1, 2)]
                grpc = [pool.submit(over_grpc, i) for i in (3, 4)]
                sizes = [f.result()[1] for f in http]
                for f in grpc:
                    f.result()
            stats = httpx.get(f"{url}/v2/models/{model}/stats").json()["model_stats"][0]
            assert stats["inference_count"] == 4
            if model == "alone":
                assert stats["execution_count"] == 4 and sizes == ["1", "1"]
                config = httpx.get(f"{url}/v2/models/alone/config").json()
                assert "dynamic_batching" not in config  # as Triton reports it: no batching
            else:
                assert stats["execution_count"] < 4


def test_instances_follow_tritons_placement(tmp_path, monkeypatch):
    """``visible_gpus`` replaced by a double (this machine has no CUDA device)."""
    torchscript = ONNX.replace('"onnxruntime_onnx"', '"pytorch_libtorch"')
    model = write(tmp_path, "m", torchscript, "model.pt")
    gpu_any = write(
        tmp_path, "g", torchscript + "instance_group [ { count: 2 kind: KIND_GPU } ]\n", "model.pt"
    )
    onnx_model = write(tmp_path, "o", ONNX, "model.onnx")
    monkeypatch.setattr(plan_module, "visible_gpus", lambda: 0)  # CPU-only host
    assert plan_model(model, Settings())[0].serving.devices == (Settings().device,)  # one instance
    with pytest.raises(ConfigError, match=r"instance_group\[0\] has kind KIND_GPU but no GPUs are available"):
        plan_model(gpu_any, Settings())
    monkeypatch.setattr(plan_module, "visible_gpus", lambda: 2)  # double: two visible GPUs
    assert plan_model(model, Settings())[0].serving.devices == ("cuda:0", "cuda:1")
    assert plan_model(model, Settings(device="cpu"))[0].serving.devices == ("cpu",)  # the user's device
    assert plan_model(gpu_any, Settings())[0].serving.devices == ("cuda:0", "cuda:0", "cuda:1", "cuda:1")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():  # this CPU build
        # an ONNX Runtime without its CUDA provider cannot use the GPUs: one instance, as before
        assert plan_model(onnx_model, Settings())[0].serving.devices == (Settings().device,)
    else:
        assert plan_model(onnx_model, Settings())[0].serving.devices == ("cuda:0", "cuda:1")
