"""Triton's config auto-complete, and ``--disable-auto-complete-config``.

Where each behaviour comes from:
- no ``platform``/``backend``: taken from the model file's name (model.onnx -> onnxruntime,
  model.pt -> pytorch, model.plan -> tensorrt); TensorFlow files are refused by name here:
  docs/user_guide/model_configuration.md "Auto-Generated Model Configuration",
  qa/L0_model_config (autofill_noplatform).
- no config.pbtxt at all but a model.onnx: the whole config from the file (inputs, outputs,
  max_batch_size = default-max-batch-size 4 with dynamic batching when every tensor's first
  dim is dynamic, else 0): model_configuration.md "Default Max Batch Size and Dynamic
  Batcher" and the onnxruntime backend's auto-complete.
- ``--disable-auto-complete-config``: the config must be complete (Triton's
  --strict-model-config successor).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tritonclient.http as thttp
from wattserve.server.models.repository.config import ConfigError
from wattserve.server.models.repository.plan import RepositorySource
from wattserve.server.settings import Settings

from tests.conformance.tiny_models import write_model
from tests.servers import threaded_server

BASE = {"torch_threads": 1, "telemetry": False, "warmup": False, "max_queue_delay_ms": 0}
TS_CONFIG = """max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


class AddOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


@pytest.fixture
def repo(tmp_path):
    write_model(tmp_path, "no_platform", config="max_batch_size: 8\n")
    write_model(tmp_path, "no_config", config=None)  # first dim dynamic
    write_model(tmp_path, "no_config_fixed", config=None, batch_dim=2)
    (tmp_path / "torchscript" / "1").mkdir(parents=True)
    torch.jit.script(AddOne()).save(str(tmp_path / "torchscript" / "1" / "model.pt"))
    (tmp_path / "torchscript" / "config.pbtxt").write_text(TS_CONFIG)
    (tmp_path / "tf" / "1" / "model.savedmodel").mkdir(parents=True)
    (tmp_path / "tf" / "config.pbtxt").write_text("max_batch_size: 1\n")
    return tmp_path


def plan(repo, name, **settings):
    return RepositorySource(repo, Settings(**BASE, **settings)).plans(name)


def test_platform_comes_from_the_model_files_name(repo):
    assert plan(repo, "no_platform")[0].platform == "onnxruntime_onnx"
    assert plan(repo, "torchscript")[0].platform == "pytorch_libtorch"
    with pytest.raises(
        ConfigError, match=r"model\.savedmodel is tensorflow_savedmodel.*no TensorFlow backend"
    ):
        plan(repo, "tf")


def test_a_directory_without_config_gets_it_from_model_onnx(repo):
    (batching,) = plan(repo, "no_config")
    assert batching.platform == "onnxruntime_onnx" and batching.batching
    assert batching.serving.max_batch_size == 4 and batching.config.HasField("dynamic_batching")
    (fixed,) = plan(repo, "no_config_fixed")
    assert not fixed.batching and fixed.config.max_batch_size == 0


def test_disabled_auto_complete_needs_a_complete_config(repo):
    with pytest.raises(
        ConfigError, match=r"neither 'platform' nor 'backend'.*--disable-auto-complete-config"
    ):
        plan(repo, "no_platform", disable_auto_complete_config=True)
    with pytest.raises(ConfigError, match=r"config\.pbtxt: missing"):
        plan(repo, "no_config", disable_auto_complete_config=True)


def test_completed_models_serve_and_report_the_completed_config(repo):
    with threaded_server(Settings(model_repository=repo, **BASE)) as (url, _app):
        client = thttp.InferenceServerClient(url.removeprefix("http://"))
        index = {m["name"]: m for m in client.get_model_repository_index()}
        assert index["tf"]["state"] == "UNAVAILABLE" and "TensorFlow" in index["tf"]["reason"]
        config = client.get_model_config("no_config")
        assert config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 4
        assert [(t["name"], t["dims"]) for t in config["input"]] == [("INPUT0", [4])]
        assert client.get_model_config("torchscript")["platform"] == "pytorch_libtorch"
        for model, name in (("no_config", "INPUT0"), ("no_platform", "INPUT0"), ("torchscript", "INPUT__0")):
            x = np.arange(12, dtype=np.float32).reshape(3, 4)
            tensor = thttp.InferInput(name, [3, 4], "FP32")
            tensor.set_data_from_numpy(x)
            result = client.infer(model, [tensor])
            np.testing.assert_array_equal(result.as_numpy(result.get_response()["outputs"][0]["name"]), x + 1)
