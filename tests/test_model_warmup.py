"""Triton's ``model_warmup``: zero, random and file samples, ``count`` and ``batch_size``, run
on every instance before the model is READY (a Python model that records what it executes
shows each run); a failing sample leaves the model UNAVAILABLE with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from wattserve.server.models.repository.config import ConfigError
from wattserve.server.models.repository.plan import plan_model
from wattserve.server.settings import Settings

from support.onnx_models import optional_add_model
from support.sequence_models import onnx_accumulator
from tests.servers import threaded_server

RECORDER = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"])["parameters"]
        self.log = params["log"]["string_value"]
        self.fail = "fail" in params

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            with open(self.log, "a") as f:
                f.write(json.dumps({"shape": list(x.shape), "data": x.tolist()}) + "\\n")
            if self.fail:
                raise ValueError("this model refuses its warm-up")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
"""
PYTHON = """backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "log" value: { string_value: "%s" } }
"""
SAMPLES = """model_warmup [
  { name: "zeros" batch_size: 2 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } },
  { name: "random" batch_size: 1 count: 3
    inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] random_data: true } } },
  { name: "file" batch_size: 4 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] input_data_file: "x.bin" } } }
]
"""
FILE_ROW = np.array([1.5, -2.0, 4.25], np.float32)


def python_model(root: Path, name: str, extra: str = "") -> Path:
    model = root / name
    (model / "1").mkdir(parents=True)
    (model / "warmup").mkdir()
    (model / "warmup" / "x.bin").write_bytes(FILE_ROW.tobytes())
    (model / "1" / "model.py").write_text(RECORDER)
    (model / "config.pbtxt").write_text(PYTHON % (root / f"{name}.log") + SAMPLES + extra)
    return model


def runs(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_samples_run_on_every_instance_before_ready_with_their_data(tmp_path):
    python_model(tmp_path, "rec")
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False)) as (url, _):
        assert httpx.get(url + "/v2/models/rec/ready").status_code == 200
        done = runs(tmp_path / "rec.log")  # all written before READY: the server started ready
        assert len(done) == 2 * (1 + 3 + 1)  # two instances x (zeros once, random 3 times, file once)
        shapes = sorted(tuple(r["shape"]) for r in done)
        assert shapes == sorted([(2, 3), (1, 3), (1, 3), (1, 3), (4, 3)] * 2)
        zeros = [r for r in done if r["shape"] == [2, 3]]
        assert all(np.array(r["data"]).tolist() == [[0.0] * 3] * 2 for r in zeros)
        files = [np.array(r["data"], np.float32) for r in done if r["shape"] == [4, 3]]
        assert all((f == FILE_ROW).all() for f in files)  # the file's element in every row
        randoms = [np.array(r["data"]) for r in done if r["shape"] == [1, 3]]
        assert any(r.any() for r in randoms)  # random, not zeros
        before = len(done)
        body = {"inputs": [{"name": "X", "shape": [1, 3], "datatype": "FP32", "data": [[1, 2, 3]]}]}
        assert httpx.post(url + "/v2/models/rec/infer", json=body).status_code == 200
        assert len(runs(tmp_path / "rec.log")) == before + 1


def test_a_failing_sample_leaves_the_model_unavailable_with_the_reason(tmp_path):
    python_model(tmp_path, "bad", 'parameters { key: "fail" value: { string_value: "yes" } }\n')
    (tmp_path / "ok" / "1").mkdir(parents=True)
    (tmp_path / "ok" / "1" / "model.onnx").write_bytes(optional_add_model())
    (tmp_path / "ok" / "config.pbtxt").write_text("""platform: "onnxruntime_onnx"
max_batch_size: 2
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
model_warmup [ { name: "ones" batch_size: 2
                 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } } ]
""")
    (tmp_path / "wrong" / "1").mkdir(parents=True)
    (tmp_path / "wrong" / "1" / "model.onnx").write_bytes(optional_add_model())
    (tmp_path / "wrong" / "config.pbtxt").write_text("""platform: "onnxruntime_onnx"
max_batch_size: 2
model_warmup [ { name: "too_wide" batch_size: 1
                 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 5 ] zero_data: true } } } ]
""")
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False)) as (url, _):
        index = {m["name"]: m for m in httpx.post(url + "/v2/repository/index", json={}).json()}
        assert index["ok"]["state"] == "READY"  # an ONNX model's sample ran and passed
        assert index["bad"]["state"] == "UNAVAILABLE"
        assert (
            "model_warmup[0] ('zeros') failed: failed to run warmup sample 'zeros'" in index["bad"]["reason"]
        )
        assert "this model refuses its warm-up" in index["bad"]["reason"]
        assert index["wrong"]["state"] == "UNAVAILABLE"
        assert "model_warmup[0] ('too_wide') failed" in index["wrong"]["reason"]
        ready = httpx.get(url + "/v2/models/bad/ready")
        assert ready.status_code == 400 and "model_warmup[0]" in ready.json()["error"]


@pytest.mark.parametrize(
    ("sample", "words"),
    [
        ('{ name: "s" batch_size: 9 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } }',
         "batch_size 9 must be 1..max_batch_size"),
        ('{ name: "s" batch_size: 1 inputs { key: "Z" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } }',
         "input 'Z': not an input of the model"),
        ('{ name: "s" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] } } }',
         "set one of zero_data, random_data or input_data_file"),
        ('{ name: "s" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 8 ] '
         'input_data_file: "x.bin" } } }', "warmup setting expects 32 bytes, but the data provided from x.bin "
         "only has 12 bytes"),
    ],
)  # fmt: skip
def test_a_bad_sample_fails_the_load_naming_it(tmp_path, sample, words):
    model = python_model(tmp_path, "m")
    text = (model / "config.pbtxt").read_text().split("model_warmup")[0]
    (model / "config.pbtxt").write_text(text + f"model_warmup [ {sample} ]\n")
    with pytest.raises(ConfigError, match="model_warmup\\[0\\] \\('s'\\)") as err:
        plan_model(model, Settings())
    assert words in str(err.value)


SEQUENCE_SAMPLE = """model_warmup [ { name: "sequence sample" batch_size: 4 count: 2
  inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 1 ] random_data: true } }
  inputs { key: "START" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
  inputs { key: "READY" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
  inputs { key: "CORRID" value: { data_type: TYPE_UINT64 dims: [ 1 ] zero_data: true } }
  inputs { key: "SUM_IN" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } } ]
"""


def test_a_stateful_models_sample_sets_its_control_and_state_inputs_and_leaves_no_state(tmp_path, caplog):
    """Triton's L0_warmup warms its sequence models with START and READY, inputs the config
    lists under sequence_batching, not ``input``; the sample runs (logged in Triton's words,
    each iteration) and no sequence starts from what it computed."""
    model = onnx_accumulator(tmp_path, "acc")
    (model / "config.pbtxt").write_text((model / "config.pbtxt").read_text() + SEQUENCE_SAMPLE)
    settings = Settings(model_repository=tmp_path, telemetry=False)
    with caplog.at_level("DEBUG", logger="wattserve.warmup"), threaded_server(settings) as (url, _):
        assert httpx.get(url + "/v2/models/acc/ready").status_code == 200
        body = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [5]}],
                "parameters": {"sequence_id": 7, "sequence_start": True}}  # fmt: skip
        answer = httpx.post(url + "/v2/models/acc/infer", json=body).json()
        assert {o["name"]: o["data"] for o in answer["outputs"]}["OUTPUT"] == [5]  # no warm-up state
    running = "model 'acc' instance on cpu is running warmup sample 'sequence sample' for iteration"
    assert f"{running} 1" in caplog.text and f"{running} 2" in caplog.text


DECOUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.fail = "fail" in args["model_config"]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            if self.fail:
                sender.send(pb_utils.InferenceResponse([], error=pb_utils.TritonError("no warm-up here")))
            else:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", x)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
DECOUPLED_CONFIG = """backend: "python"
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU } ]
model_transaction_policy { decoupled: true }
model_warmup [ { name: "decoupled sample" batch_size: 1
                 inputs { key: "INPUT" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
"""


@pytest.mark.parametrize("isolation", ["process", "thread"])
def test_a_decoupled_models_sample_runs_through_its_response_sender(tmp_path, isolation):
    """Triton's L0_warmup 'decoupled': the sample is done at the final response; a response's
    error fails it, in Triton's words."""
    for name, extra in (
        ("streams", ""),
        ("refuses", 'parameters { key: "fail" value: { string_value: "1" } }\n'),
    ):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.py").write_text(DECOUPLED)
        (tmp_path / name / "config.pbtxt").write_text(DECOUPLED_CONFIG + extra)
    settings = Settings(model_repository=tmp_path, telemetry=False, python_model_isolation=isolation)
    with threaded_server(settings) as (url, _):
        index = {m["name"]: m for m in httpx.post(url + "/v2/repository/index", json={}).json()}
        assert index["streams"]["state"] == "READY"
        assert index["refuses"]["state"] == "UNAVAILABLE"
        assert (
            "failed to run warmup sample 'decoupled sample': no warm-up here;" in index["refuses"]["reason"]
        )
