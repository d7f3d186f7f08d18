"""Subnormal floats: computed as IEEE says by default, flushed to zero where the model's
``flush_denormal`` asks (torch, TorchScript, ONNX Runtime on CPU), results unchanged on
ordinary inputs. Real engines on real engine threads; the served path through a repository."""

from __future__ import annotations

import httpx
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from wattserve.batchers.executor import engine_thread
from wattserve.engines.base import TensorSpec
from wattserve.engines.onnxruntime_engine import OnnxRuntimeEngine
from wattserve.engines.torch_engine import TorchVisionEngine
from wattserve.engines.torchscript_engine import TorchScriptEngine
from wattserve.server.settings import Settings

from tests.servers import threaded_server

N = 1024
SPEC_IN, SPEC_OUT = TensorSpec("INPUT0", (N,), "FP32"), TensorSpec("OUTPUT0", (N,), "FP32")
TINY = np.finfo(np.float32).tiny  # the smallest normal FP32


def inputs() -> tuple[np.ndarray, np.ndarray]:
    """(ordinary values, subnormal values) as one batch row each."""
    rng = np.random.default_rng(0)
    ordinary = rng.standard_normal((1, N), dtype=np.float32)
    subnormal = (rng.uniform(0.01, 0.4, (1, N)) * TINY).astype(np.float32)
    assert (subnormal != 0).all() and (np.abs(subnormal) < TINY).all()
    return ordinary, subnormal


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0  # a subnormal doubled stays subnormal below TINY / 2


@pytest.fixture(scope="module")
def torchscript_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ts") / "model.pt"
    torch.jit.script(Double()).save(str(path))
    return path


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "two"], ["OUTPUT0"])], "double",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", N])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", N])], [two],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("onnx") / "model.onnx"
    onnx.save(model, str(path))
    return path


def on_engine_thread(flush: bool, build, name: str, *batches: np.ndarray) -> list[dict[str, np.ndarray]]:
    """Build the engine and run each batch on one engine thread, as the server does."""
    thread = engine_thread(0, flush_denormal=flush)
    try:
        engine = thread.submit(build).result()
        return [thread.submit(engine.infer, {name: x}).result() for x in batches]
    finally:
        thread.shutdown(wait=True)


def check_doubling(outputs_ieee, outputs_flushed, ordinary, subnormal, name="OUTPUT0"):
    (ord_ieee, sub_ieee), (ord_flush, sub_flush) = outputs_ieee, outputs_flushed
    assert np.array_equal(ord_ieee[name], ordinary * 2) and np.array_equal(ord_flush[name], ord_ieee[name])
    assert np.array_equal(sub_ieee[name], subnormal * 2)  # IEEE by default: subnormals computed
    assert not sub_flush[name].any()  # flushed: read as zero, written as zero


def test_torchscript_flushes_only_on_a_flushing_engine_thread(torchscript_file):
    ordinary, subnormal = inputs()

    def build():
        return TorchScriptEngine(torchscript_file, name="double", inputs=[SPEC_IN], outputs=[SPEC_OUT],
                                 max_batch_size=1, device="cpu")  # fmt: skip

    runs = [on_engine_thread(flush, build, "INPUT0", ordinary, subnormal) for flush in (False, True)]
    check_doubling(*runs, ordinary, subnormal)
    assert torch.tensor([1e-39]).item() != 0  # this thread's own mode is untouched


def test_onnxruntime_flushes_only_when_asked(onnx_file):
    ordinary, subnormal = inputs()
    runs = []
    for flush in (False, True):

        def build(flush=flush):
            return OnnxRuntimeEngine(onnx_file, name="double", max_batch_size=4, device="cpu", threads=2,
                                     flush_denormal=flush)  # fmt: skip

        runs.append(on_engine_thread(flush, build, "INPUT0", ordinary, subnormal))
    check_doubling(*runs, ordinary, subnormal)


def test_mobilenet_answers_the_same_on_ordinary_inputs_flushed_or_not():
    images = np.random.default_rng(1).standard_normal((2, 3, 224, 224), dtype=np.float32)

    def build():
        return TorchVisionEngine("mobilenet_v2", device="cpu", max_batch_size=2)

    ieee, flushed = (on_engine_thread(f, build, "input", images)[0]["logits"] for f in (False, True))
    assert np.allclose(flushed, ieee, rtol=1e-5, atol=1e-6 * np.abs(ieee).max())


CONFIG = f"""platform: "pytorch_libtorch"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {N} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {N} ] }} ]
"""


def test_served_model_flushes_when_its_config_says_so(tmp_path, torchscript_file):
    for name, extra in (
        ("ieee", ""),
        ("flushed", 'parameters { key: "flush_denormal" value: { string_value: "true" } }'),
    ):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(CONFIG + extra)
        (tmp_path / name / "1" / "model.pt").write_bytes(torchscript_file.read_bytes())
    _, subnormal = inputs()
    blob = subnormal.tobytes()
    header = (b'{"inputs":[{"name":"INPUT0","shape":[1,%d],"datatype":"FP32","parameters":{"binary_data_size":%d}}],'
              b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}' % (N, len(blob)))  # fmt: skip
    answers = {}
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False)) as (url, _):
        for name in ("ieee", "flushed"):
            r = httpx.post(f"{url}/v2/models/{name}/infer", content=header + blob,
                           headers={"Inference-Header-Content-Length": str(len(header))}, timeout=60)  # fmt: skip
            assert r.status_code == 200, r.text
            n = int(r.headers["Inference-Header-Content-Length"])
            answers[name] = np.frombuffer(r.content[n:], np.float32)
    assert np.array_equal(answers["ieee"], subnormal.ravel() * 2)
    assert not answers["flushed"].any()


def test_setting_reaches_the_engine_config():
    assert Settings().engine_config().flush_denormal is False  # Triton's backends: IEEE
    assert Settings(flush_denormal=True).engine_config().flush_denormal is True
