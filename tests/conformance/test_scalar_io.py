"""Scalar tensors declared with dims of ones (Triton's qa/L0_scalar_io: a model whose ONNX
tensors are shape [] is configured with dims [1] or [1, 1]; clients send that shape; a
config that declares any other size for a scalar fails to load)."""

from __future__ import annotations

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
from wattserve.loadgen.server_process import free_port
from wattserve.server.settings import Settings

from support.onnx_models import scalar_identity_model
from tests.servers import threaded_server


def test_scalar_models_serve_the_configured_ones_shape(tmp_path):
    scalar_identity_model(tmp_path, "scalar_1dim", [1])
    scalar_identity_model(tmp_path, "scalar_2dim", [1, 1])
    scalar_identity_model(tmp_path, "scalar_wrong", [2])
    grpc_port = free_port()
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False, grpc_port=grpc_port)) as (
        url,
        _,
    ):
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        for model, value in (("scalar_1dim", np.asarray([1.5], np.float32)),
                             ("scalar_2dim", np.asarray([[2.5]], np.float32))):  # fmt: skip
            tensor = grpcclient.InferInput("INPUT", list(value.shape), "FP32")
            tensor.set_data_from_numpy(value)
            out = client.infer(model, [tensor]).as_numpy("OUTPUT")
            np.testing.assert_allclose(out, value)
            assert out.shape == value.shape
        client.close()
        index = {m["name"]: m for m in httpx.post(f"{url}/v2/repository/index", json={}).json()}
        assert index["scalar_1dim"]["state"] == "READY"
        assert index["scalar_wrong"]["state"] == "UNAVAILABLE"
        assert "TYPE_FP32 [2] in the config but TYPE_FP32 [] in the model" in index["scalar_wrong"]["reason"]
