"""config.pbtxt read as Triton reads it: errors name file, line and field; honoured fields
keep Triton's meaning; unimplemented ones are refused at load, or named in warnings when
allowed (tests/test_unsupported_config.py walks them all); WATTSERVE_BATCHER still
swaps every model that does not pin its batcher; NaN/Inf served unless checked."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import tritonclient
from wattserve.server.app import create_app
from wattserve.server.models.model_set import ModelLoadError
from wattserve.server.models.repository.config import ConfigError, parse_config, read_config
from wattserve.server.models.repository.plan import RepositorySource, plan_model
from wattserve.server.models.serving_config import ServingConfig
from wattserve.server.settings import Settings

from tests.servers import ROOT, threaded_server


def write_model(root: Path, name: str, config: str, files: dict[str, bytes] | None = None) -> Path:
    model = root / name
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    for rel, data in (files or {}).items():
        (model / rel).parent.mkdir(parents=True, exist_ok=True)
        (model / rel).write_bytes(data)
    return model


def test_unknown_field_names_file_line_and_field(tmp_path):
    model = write_model(tmp_path, "m", 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\nbatch_size: 8\n')
    with pytest.raises(ConfigError) as err:
        read_config(model)
    assert f"{model}/config.pbtxt:3:" in str(err.value)
    assert '"batch_size"' in str(err.value)


def test_syntax_error_and_bad_value_name_the_line():
    with pytest.raises(ConfigError, match=r"x.pbtxt:2:\d+: .*max_queue_delay_microseconds"):
        parse_config("dynamic_batching {\n max_queue_delay_microseconds: -5 }", "x.pbtxt")
    with pytest.raises(ConfigError, match=r"x.pbtxt:1:\d+"):
        parse_config("input [ { name: 'a' ", "x.pbtxt")


def test_missing_model_file_and_name_mismatch(tmp_path):
    write_model(tmp_path, "a", 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n', {"1/other.bin": b""})
    with pytest.raises(ConfigError, match=r"a/1/model.onnx: missing"):
        plan_model(tmp_path / "a", Settings())
    write_model(tmp_path, "b", 'name: "c"\nbackend: "wattserve"\n')
    with pytest.raises(ConfigError, match="field 'name'"):
        plan_model(tmp_path / "b", Settings())
    write_model(tmp_path, "d", 'platform: "tensorflow_savedmodel"\n')
    with pytest.raises(ConfigError, match="field 'platform'"):
        plan_model(tmp_path / "d", Settings())


FULL = """
backend: "wattserve"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 8 ] format: FORMAT_NCHW } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 8 ] label_filename: "labels.txt" } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 2500
  priority_levels: 3
  default_priority_level: 2
  preserve_ordering: true
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 40000
                         allow_timeout_override: true max_queue_size: 17 }
}
instance_group [ { count: 2 kind: KIND_CPU }, { count: 1 kind: KIND_GPU gpus: [ 0, 1 ] } ]
optimization { graph { level: 1 } }
version_policy { specific { versions: [ 1, 3 ] } }
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "8" } }
parameters { key: "colour" value: { string_value: "blue" } }
"""


def test_honoured_fields_map_with_triton_meaning_and_the_rest_refused_or_warned(tmp_path):
    for v in ("1", "2", "3"):
        (tmp_path / "full" / v).mkdir(parents=True)
    (tmp_path / "full" / "config.pbtxt").write_text(FULL)
    # input[0].format is honoured, and as in Triton NCHW needs 3 dims (FULL's input has 1)
    with pytest.raises(ConfigError, match=r"input\[0\] \(INPUT0\) format FORMAT_NCHW: model input NHWC/NCHW"):
        plan_model(tmp_path / "full", Settings(allow_unsupported_config=True))
    (tmp_path / "full" / "config.pbtxt").write_text(FULL.replace(" format: FORMAT_NCHW", ""))
    # what wattserve does not run is refused at load, naming each field and why
    with pytest.raises(ConfigError) as refused:
        plan_model(tmp_path / "full", Settings())
    assert "'optimization' is not supported" in str(refused.value)
    assert "preserve_ordering" not in str(refused.value)  # honoured: answers in arrival order
    # ... unless allowed: then it loads without them, each named in a warning
    plans = plan_model(tmp_path / "full", Settings(allow_unsupported_config=True))
    assert [p.version for p in plans] == ["1", "3"]  # version_policy specific
    s = plans[0].serving  # the typed parts: engine, batching, queue policy, devices
    assert (s.engine.model, s.max_batch_size, s.batching.batcher) == ("identity", 16, "dynamic")
    assert s.batching.preferred_batch_sizes == (4, 8) and s.batching.max_queue_delay_ms == 2.5
    assert (s.batching.priority_levels, s.queue.default_priority) == (3, 2)
    assert (s.queue.default_timeout_ms, s.queue.allow_timeout_override, s.batching.max_queue_size) == (
        40.0,
        True,
        17,
    )
    assert s.queue.timeout_action == "delay"  # honoured since the fourteenth session
    assert s.engine.identity_elements == 8 and s.engine.max_batch_size == 16
    assert s.devices == ("cpu", "cpu", "cuda:0", "cuda:1")
    assert len(s.devices) == 4
    warned = " | ".join(plans[0].warnings)
    for field in (
        "optimization",
        "'colour'",
    ):
        assert field in warned, field
    assert (
        "max_queue_delay" not in warned and "instance_group" not in warned and "timeout_action" not in warned
    )
    assert "label_filename" not in warned  # honoured: the classification extension's labels
    assert "preserve_ordering" not in warned and s.preserve_ordering  # honoured (test_preserve_ordering.py)
    assert not plans[0].config.HasField("optimization")  # cleared: the plan is what runs


def test_latest_version_by_default(tmp_path):
    write_model(tmp_path, "ident", 'backend: "wattserve"\nparameters { key: "builtin" value: { string_value: "identity" } }',
                {"1/.keep": b"", "2/.keep": b"", "10/.keep": b""})  # fmt: skip
    assert [p.version for p in plan_model(tmp_path / "ident", Settings())] == ["10"]


def test_env_batcher_swaps_models_that_do_not_pin_one(tmp_path, monkeypatch):
    write_model(tmp_path, "free", 'backend: "wattserve"\nmax_batch_size: 4\ndynamic_batching { }\n'
                'parameters { key: "builtin" value: { string_value: "identity" } }')  # fmt: skip
    write_model(tmp_path, "pinned", 'backend: "wattserve"\nmax_batch_size: 4\n'
                'parameters { key: "builtin" value: { string_value: "identity" } }\n'
                'parameters { key: "batcher" value: { string_value: "continuous" } }')  # fmt: skip
    source = RepositorySource(tmp_path, Settings())
    assert source.plans("free")[0].serving.batching.batcher == "dynamic"
    monkeypatch.setenv("WATTSERVE_BATCHER", "static")
    source = RepositorySource(tmp_path, Settings())
    assert source.plans("free")[0].serving.batching.batcher == "static"
    assert source.plans("pinned")[0].serving.batching.batcher == "continuous"


def test_strict_makes_a_failed_load_fatal(tmp_path):
    write_model(
        tmp_path,
        "ok",
        'backend: "wattserve"\nparameters { key: "builtin" value: { string_value: "identity" } }',
    )
    write_model(
        tmp_path, "bad", 'platform: "onnxruntime_onnx"\nmax_batch_size: 2\n', {"1/model.onnx": b"junk"}
    )
    app = create_app(Settings(model_repository=tmp_path, strict=True, telemetry=False))
    with pytest.raises(ModelLoadError, match="bad"):
        asyncio.run(app.state.models.start())
    asyncio.run(app.state.models.stop())
    write_model(tmp_path, "unparsable", "max_batch_size: [")
    with pytest.raises(ModelLoadError, match="unparsable"):
        create_app(Settings(model_repository=tmp_path, strict=True, telemetry=False))


class Doubler(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.dim() == 2  # no batch axis: max_batch_size 0, reshaped to [2, 2]
        return x * 2


def test_no_batching_and_reshape_on_a_live_server(tmp_path):
    torch.jit.script(Doubler()).save(str(tmp_path / "model.pt"))
    write_model(tmp_path / "repo", "dbl", """
platform: "pytorch_libtorch"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
""", {"1/model.pt": (tmp_path / "model.pt").read_bytes()})  # fmt: skip
    with threaded_server(Settings(model_repository=tmp_path / "repo", telemetry=False)) as (url, _):
        ok = httpx.post(url + "/v2/models/dbl/infer", json={"inputs": [
            {"name": "INPUT__0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})  # fmt: skip
        assert ok.status_code == 200, ok.text
        assert ok.json()["outputs"][0] == {"name": "OUTPUT__0", "datatype": "FP32", "shape": [4],
                                           "data": [2.0, 4.0, 6.0, 8.0]}  # fmt: skip
        batched = httpx.post(url + "/v2/models/dbl/infer", json={"inputs": [
            {"name": "INPUT__0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})  # fmt: skip
        assert batched.status_code == 400 and "does not batch" in batched.json()["error"]
        meta = httpx.get(url + "/v2/models/dbl").json()
        assert meta["inputs"][0]["shape"] == [4]
        assert httpx.get(url + "/v2/models/dbl/config").json()["max_batch_size"] == 0


def test_timeout_action_delay_runs_expired_requests_after_the_rest_on_a_live_server(tmp_path):
    """Triton's ``timeout_action: DELAY``: a request whose queue timeout passes is not
    refused; it is computed (after the on-time ones) and answered with its own data. The
    same config with REJECT answers them UNAVAILABLE (the control)."""
    for action in ("DELAY", "REJECT"):
        policy = f"default_queue_policy {{ timeout_action: {action} default_timeout_microseconds: 50000 }}"
        write_model(tmp_path / action, "slow", IDENTITY4 % 2 + f"dynamic_batching {{ {policy} }}\n"
                    'parameters { key: "identity_delay_ms" value: { string_value: "200" } }\n')  # fmt: skip
    with threaded_server(Settings(model_repository=tmp_path / "DELAY", telemetry=False)) as (url, _):
        config = httpx.get(url + "/v2/models/slow/config").json()
        assert config["dynamic_batching"]["default_queue_policy"]["timeout_action"] == "DELAY"
        with ThreadPoolExecutor(6) as pool:  # 200 ms batches of 4: the last ones wait > 50 ms
            answers = list(pool.map(lambda v: _infer_identity(url, "slow", v), range(6)))
        assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
        for v, a in enumerate(answers):
            assert a.json()["outputs"][0]["data"] == [float(v)] * 2  # each its own rows
    with threaded_server(Settings(model_repository=tmp_path / "REJECT", telemetry=False)) as (url, _):
        with ThreadPoolExecutor(6) as pool:
            statuses = sorted(
                a.status_code for a in pool.map(lambda v: _infer_identity(url, "slow", v), range(6))
            )
        assert set(statuses) == {503}  # each outlived its 50 ms: refused (while queued or computing)


def _infer_identity(url: str, model: str, value: float) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [value, value]}]}
    return httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)


NAN_BODY = (
    b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[NaN,Infinity,-Infinity,1.5]}]}'
)
IDENTITY4 = """backend: "wattserve"
max_batch_size: 4
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "%d" } }
"""


def test_nan_and_infinity_served_by_default_and_refused_when_checked(tmp_path):
    write_model(tmp_path, "json", IDENTITY4 % 4)
    write_model(
        tmp_path,
        "json_checked",
        IDENTITY4 % 4 + 'parameters { key: "check_values" value: { string_value: "true" } }',
    )
    write_model(tmp_path, "raw", IDENTITY4 % 4096)
    write_model(
        tmp_path,
        "raw_checked",
        IDENTITY4 % 4096 + 'parameters { key: "check_values" value: { string_value: "true" } }',
    )
    raw = np.random.default_rng(0).integers(0, 2**32, size=4096, dtype=np.uint32)  # what perf_analyzer sends
    raw[:3] = [0x7FC00000, 0x7F800000, 0xFF800000]  # NaN, +Inf, -Inf bit patterns for sure
    blob = raw.tobytes()
    header = (b'{"inputs":[{"name":"INPUT0","shape":[1,4096],"datatype":"FP32","parameters":{"binary_data_size":%d}}],'
              b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}' % len(blob))  # fmt: skip
    binary = {"content": header + blob, "headers": {"Inference-Header-Content-Length": str(len(header))}}
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False)) as (url, _):
        r = httpx.post(url + "/v2/models/json/infer", content=NAN_BODY)
        assert r.status_code == 200, r.text
        assert b"NaN" in r.content and b"-Infinity" in r.content  # written back as Triton writes them
        data = r.json()["outputs"][0]["data"]
        assert math.isnan(data[0]) and data[1:] == [math.inf, -math.inf, 1.5]
        r = httpx.post(url + "/v2/models/raw/infer", **binary)
        assert r.status_code == 200, r.text
        n = int(r.headers["Inference-Header-Content-Length"])
        assert r.content[n:] == blob  # every bit pattern computed and returned as sent
        for model, request in (("json_checked", {"content": NAN_BODY}), ("raw_checked", binary)):
            refused = httpx.post(f"{url}/v2/models/{model}/infer", **request)
            assert refused.status_code == 400 and "NaN or Inf" in refused.json()["error"]
        fine = httpx.post(url + "/v2/models/json_checked/infer", json={"inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})  # fmt: skip
        assert fine.status_code == 200


def triton_model_config_module():
    """tritonclient's own generated ModelConfig module, loaded from its file (its package
    __init__ wants grpcio, which the HTTP client does not need)."""
    path = Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location("triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_export_writes_an_entry_triton_parses_and_wattserve_serves(tmp_path):
    from google.protobuf import text_format

    repo = tmp_path / "repo"
    done = subprocess.run([sys.executable, "-m", "wattserve", "export", "--model", "mobilenet_v2", "--legacy",
                           "--verify", "1", "--repository", str(repo), "--cache-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert (repo / "mobilenet_v2" / "1" / "model.onnx").is_file()
    triton_pb = triton_model_config_module()
    config = text_format.Parse((repo / "mobilenet_v2" / "config.pbtxt").read_text(), triton_pb.ModelConfig())
    assert (config.platform, config.max_batch_size) == ("onnxruntime_onnx", 8)
    assert [i.name for i in config.input] == ["input"] and list(config.output[0].dims) == [1000]
    with threaded_server(Settings(model_repository=repo, telemetry=False, warmup=False)) as (url, _):
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
        r = httpx.post(url + "/v2/models/mobilenet_v2/infer", json={"inputs": [
            {"name": "input", "shape": [1, 3, 224, 224], "datatype": "FP32", "data": x.ravel().tolist()}]})  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["shape"] == [1, 1000]


TRT_CONFIG = """
platform: "tensorrt_plan"
max_batch_size: 8
instance_group [ { count: 1 kind: KIND_GPU gpus: [ 0 ] } ]
"""


def test_tensorrt_plan_without_tensorrt_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # the real, absent library
    write_model(tmp_path, "trt", TRT_CONFIG, {"1/model.plan": b"plan bytes"})
    write_model(
        tmp_path,
        "ident",
        'backend: "wattserve"\nparameters { key: "builtin" value: { string_value: "identity" } }',
    )
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False)) as (url, _):
        r = httpx.get(url + "/v2/models/trt/ready")
        assert r.status_code == 400 and "tensorrt" in r.json()["error"].lower()
        assert httpx.get(url + "/v2/models/ident/ready").status_code == 200


def test_tensorrt_plan_served_through_the_tensorrt_engine_on_the_double(tmp_path, monkeypatch):
    """Wiring only: FakeTensorRT (support/doubles) stands in for TensorRT and a GPU, which this
    machine lacks; real TensorRT runs only in scripts/gpu_check.sh."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from wattserve.engines.profiles import parse_profiles
    from wattserve.engines.tensorrt_engine import GpuIdentity, load_or_build_plan

    from support.doubles import fake_tensorrt

    w = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "W"], ["logits"])], "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        initializer=[numpy_helper.from_array(w, "W")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "tiny.onnx"))
    fake_tensorrt.install(monkeypatch)
    record = load_or_build_plan(tmp_path / "tiny.onnx", parse_profiles("1:4:8"), model="tiny",
                                gpu=GpuIdentity("Fake", "9.0"), fp16=False, cache_dir=tmp_path / "cache")  # fmt: skip
    write_model(tmp_path / "repo", "trt", TRT_CONFIG, {"1/model.plan": record.path.read_bytes()})
    with threaded_server(Settings(model_repository=tmp_path / "repo", telemetry=False)) as (url, _):
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        r = httpx.post(url + "/v2/models/trt/infer", json={"inputs": [
            {"name": "input", "shape": [3, 4], "datatype": "FP32", "data": x.ravel().tolist()}]})  # fmt: skip
        assert r.status_code == 200, r.text
        got = np.array(r.json()["outputs"][0]["data"], np.float32).reshape(3, 3)
        np.testing.assert_allclose(got, x @ w, rtol=1e-5)
        assert httpx.get(url + "/v2/models/trt").json()["platform"] == "tensorrt_plan"


def test_queue_policy_timeout_override_with_triton_meaning():
    from wattserve.server.models.metrics import ServingMetrics
    from wattserve.server.models.runtime import ModelRuntime

    def deadline_in(settings: Settings, timeout_us: int | None) -> float | None:
        runtime = ModelRuntime(
            ServingConfig.from_settings(settings), lambda s: None, ServingMetrics("m", "dynamic")
        )
        item = runtime.work_item({}, 0, timeout_us)
        return None if item.deadline is None else round(item.deadline - item.arrival, 3)

    policy = Settings(default_timeout_ms=40, allow_timeout_override=False)
    assert deadline_in(policy, 10_000) == 0.04  # the request may not override
    assert deadline_in(policy, None) == 0.04
    override = Settings(default_timeout_ms=40, allow_timeout_override=True)
    assert deadline_in(override, 10_000) == 0.01  # it may shorten the default ...
    assert deadline_in(override, 90_000) == 0.04  # ... not extend it
    assert deadline_in(Settings(), 10_000) == 0.01  # no queue policy: the request's own timeout
    assert deadline_in(Settings(), None) is None
