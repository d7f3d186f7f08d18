"""ONNX export + ONNX Runtime engine agree with torch at batch sizes across 1..32.

Tolerance: relative to the output's scale, max|ort - torch| <= 1e-4 * max|torch| (measured
here: ~7e-6 on mobilenet_v2 at batch 1..32). The model is exported once per test session to
a temporary folder.
"""

from __future__ import annotations

import httpx
import numpy as np
import onnx
import pytest
import torch
import tritonclient.http as triton
from onnx import TensorProto, helper
from wattserve.engines.base import Engine, EngineError, EngineUnavailable, TensorSpec
from wattserve.engines.onnx_export import (
    DEFAULT_RTOL,
    build_torchvision_model,
    check_onnx,
    compare_with_torch,
    default_onnx_path,
    ensure_onnx,
    export_onnx,
    recipe_digest,
)
from wattserve.engines.onnxruntime_engine import OnnxRuntimeEngine, resolve_providers
from wattserve.server.cli import main as cli_main
from wattserve.server.settings import Settings

from tests.servers import server_process

MODEL = "mobilenet_v2"
SIZES = [1, 3, 8, 17, 32]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("wattserve-cache")


@pytest.fixture(scope="session")
def torch_model():
    return build_torchvision_model(MODEL, seed=0)


@pytest.fixture(scope="session")
def onnx_file(cache_dir, torch_model):
    return export_onnx(torch_model, default_onnx_path(cache_dir, MODEL, seed=0))


@pytest.fixture(scope="session")
def ort_engine(onnx_file):
    engine = OnnxRuntimeEngine(onnx_file, name=MODEL, max_batch_size=32, device="cpu")
    yield engine
    engine.close()


def _relative(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.slow
def test_export_has_names_and_dynamic_batch(onnx_file):
    check_onnx(onnx_file)
    graph = onnx.load(str(onnx_file)).graph
    (inp,) = graph.input
    (out,) = graph.output
    assert (inp.name, out.name) == ("input", "logits")
    dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    assert isinstance(dims[0], str) and dims[0]
    assert dims[1:] == [3, 224, 224]


@pytest.mark.slow
def test_engine_contract(ort_engine):
    assert isinstance(ort_engine, Engine)
    assert ort_engine.platform == "onnxruntime"
    assert ort_engine.device == "cpu"
    assert ort_engine.batch_sizes is None
    assert ort_engine.inputs == [TensorSpec("input", (3, 224, 224), "FP32")]
    assert ort_engine.outputs == [TensorSpec("logits", (1000,), "FP32")]


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", SIZES)
def test_onnxruntime_matches_torch(ort_engine, torch_model, batch_size):
    x = np.random.default_rng(batch_size).standard_normal((batch_size, 3, 224, 224))
    x = x.astype(np.float32)
    with torch.inference_mode():
        ref = torch_model(torch.from_numpy(x)).numpy()
    out = ort_engine.infer({"input": x})
    assert out["logits"].shape == (batch_size, 1000)
    assert out["logits"].dtype == np.float32
    assert _relative(out["logits"], ref) <= DEFAULT_RTOL


@pytest.mark.slow
def test_same_item_same_output_whatever_the_batch(ort_engine):
    rng = np.random.default_rng(7)
    item = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    alone = ort_engine.infer({"input": item})["logits"][0]
    others = rng.standard_normal((7, 3, 224, 224)).astype(np.float32)
    batched = ort_engine.infer({"input": np.concatenate([others[:4], item, others[4:]])})
    assert _relative(batched["logits"][4], alone) <= DEFAULT_RTOL


@pytest.mark.slow
def test_compare_with_torch_report(torch_model, onnx_file):
    report = compare_with_torch(torch_model, onnx_file, [1, 2])
    assert [a.batch_size for a in report] == [1, 2]
    assert all(a.max_abs_ref > 0 and a.rel_diff <= DEFAULT_RTOL for a in report)


@pytest.mark.slow
def test_engine_rejects_bad_batches(ort_engine):
    with pytest.raises(EngineError, match="missing input"):
        ort_engine.infer({"image": np.zeros((1, 3, 224, 224), np.float32)})
    with pytest.raises(EngineError, match="exceeds"):
        ort_engine.infer({"input": np.zeros((33, 3, 224, 224), np.float32)})
    with pytest.raises(EngineError, match="onnxruntime failed"):
        ort_engine.infer({"input": np.zeros((1, 3, 100, 100), np.float32)})


@pytest.mark.slow
def test_ensure_onnx_uses_cache_or_given_path(cache_dir, onnx_file):
    settings = Settings(model=MODEL, cache_dir=cache_dir, seed=0)
    assert ensure_onnx(settings.engine_config()) == onnx_file
    settings = Settings(model=MODEL, onnx_path=onnx_file)
    assert ensure_onnx(settings.engine_config()) == onnx_file
    engine = OnnxRuntimeEngine.from_config(
        Settings(model=MODEL, cache_dir=cache_dir, max_batch_size=4, device="cpu").engine_config()
    )
    assert engine.max_batch_size == 4
    assert engine.infer({"input": np.zeros((4, 3, 224, 224), np.float32)})["logits"].shape == (
        4,
        1000,
    )


def test_missing_files_and_devices_are_unavailable(tmp_path):
    with pytest.raises(EngineUnavailable, match="does not exist"):
        ensure_onnx(Settings(onnx_path=tmp_path / "nope.onnx").engine_config())
    with pytest.raises(EngineUnavailable, match="does not exist"):
        OnnxRuntimeEngine(tmp_path / "nope.onnx", name="m", max_batch_size=1)
    with pytest.raises(EngineUnavailable, match="onnxruntime-gpu"):
        resolve_providers("cuda:0", ["CPUExecutionProvider"])
    with pytest.raises(EngineUnavailable, match="unknown device"):
        resolve_providers("tpu", ["CPUExecutionProvider"])
    assert resolve_providers("cpu", ["CUDAExecutionProvider", "CPUExecutionProvider"]) == (
        ["CPUExecutionProvider"],
        "cpu",
    )
    providers, device = resolve_providers("cuda:1", ["CUDAExecutionProvider"])
    assert device == "cuda:1"
    assert providers[0] == ("CUDAExecutionProvider", {"device_id": 1})
    with pytest.raises(EngineUnavailable, match="supports"):
        build_torchvision_model("identity")


def test_checker_rejects_fixed_batch_and_wrong_names(tmp_path):
    def save(in_name: str, batch) -> str:
        x = helper.make_tensor_value_info(in_name, TensorProto.FLOAT, [batch, 4])
        y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 4])
        graph = helper.make_graph([helper.make_node("Relu", [in_name], ["logits"])], "g", [x], [y])
        path = tmp_path / f"{in_name}-{batch}.onnx"
        onnx.save(helper.make_model(graph), str(path))
        return str(path)

    check_onnx(save("input", "batch"))
    with pytest.raises(ValueError, match="fixed batch"):
        check_onnx(save("input", 8))
    with pytest.raises(ValueError, match="expected input"):
        check_onnx(save("images", "batch"))


@pytest.mark.slow
def test_export_cli_with_legacy_exporter(tmp_path, capsys):
    out = tmp_path / "legacy.onnx"
    assert cli_main(["export", "--model", MODEL, "--out", str(out), "--legacy", "--verify", "1,2"]) == 0
    text = capsys.readouterr().out
    assert "legacy" in text and "onnx.checker passed" in text
    assert text.count(" ok") == 2
    check_onnx(out)


def test_cached_export_name_follows_the_weights_recipe(tmp_path):
    base = default_onnx_path(tmp_path, MODEL, seed=0)
    assert base == default_onnx_path(tmp_path, MODEL, seed=0)
    assert base.parent == tmp_path and base.name.startswith(MODEL) and base.suffix == ".onnx"
    assert default_onnx_path(tmp_path, MODEL, seed=1) != base
    assert default_onnx_path(tmp_path, MODEL, seed=0, legacy=True) != base
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"one")
    first = recipe_digest(MODEL, 0, str(weights))
    weights.write_bytes(b"two")
    assert recipe_digest(MODEL, 0, str(weights)) != first


def _infer_binary(client: httpx.Client, url: str, x: np.ndarray) -> tuple[np.ndarray, int]:
    """POST one KServe v2 request (binary tensor extension); (logits, X-Batch-Size)."""
    inp = triton.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    out = triton.InferRequestedOutput("logits", binary_data=True)
    body, json_size = triton.InferenceServerClient.generate_request_body([inp], [out])
    headers = {"Inference-Header-Content-Length": str(json_size)}
    r = client.post(f"{url}/v2/models/{MODEL}/infer", content=body, headers=headers)
    assert r.status_code == 200, r.text
    result = triton.InferResult.from_response_body(
        r.content, header_length=int(r.headers["Inference-Header-Content-Length"])
    )
    return result.as_numpy("logits"), int(r.headers["X-Batch-Size"])


@pytest.mark.slow
def test_live_server_with_onnxruntime_matches_torch(onnx_file, torch_model):
    """WATTSERVE_ENGINE=onnxruntime in a real server process: batches 1..32 equal torch's."""
    env = {
        "WATTSERVE_MODEL": MODEL,
        "WATTSERVE_ENGINE": "onnxruntime",
        "WATTSERVE_ONNX_PATH": str(onnx_file),
        "WATTSERVE_DEVICE": "cpu",
        "WATTSERVE_BATCHER": "dynamic",
        "WATTSERVE_MAX_BATCH_SIZE": "32",
        "WATTSERVE_MAX_QUEUE_DELAY_MS": "20",
        "WATTSERVE_WARMUP": "false",
        "WATTSERVE_LOG_LEVEL": "warning",
    }
    rng = np.random.default_rng(11)
    with server_process(env) as server, httpx.Client(timeout=120) as client:
        meta = client.get(f"{server.url}/v2/models/{MODEL}").json()
        assert meta["platform"] == "onnxruntime"
        for n in (1, 7, 32):
            x = rng.standard_normal((n, 3, 224, 224)).astype(np.float32)
            with torch.inference_mode():
                ref = torch_model(torch.from_numpy(x)).numpy()
            logits, batch_size = _infer_binary(client, server.url, x)
            assert logits.shape == (n, 1000)
            assert 1 <= batch_size <= 32
            assert _relative(logits, ref) <= DEFAULT_RTOL
        # the 32 rows of one request ride in batches the server formed; all rows answered
        assert batch_size > 1


@pytest.mark.slow
def test_registry_builds_each_engine_or_says_why_not(onnx_file, monkeypatch):
    import sys

    from wattserve.engines.registry import build_engine

    engine = build_engine(
        Settings(model=MODEL, engine="onnxruntime", onnx_path=onnx_file, device="cpu").engine_config()
    )
    assert isinstance(engine, OnnxRuntimeEngine)
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(EngineUnavailable, match="TensorRT is not installed"):
        build_engine(Settings(model=MODEL, engine="tensorrt", onnx_path=onnx_file).engine_config())
    with pytest.raises(EngineUnavailable, match="CUDA"):
        build_engine(Settings(model=MODEL, engine="torch", device="cpu", cuda_graphs=True).engine_config())
