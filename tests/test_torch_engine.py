"""The real torchvision model: the same input gives the same output alone or inside a
batch of any size, two servers agree, weights load from a local file, images classify."""

from __future__ import annotations

import io
import threading

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from PIL import Image
from wattserve.engines.torch_engine import TorchVisionEngine, load_torchvision_model
from wattserve.server.settings import Settings

from tests.servers import threaded_server

# Logits are O(0.1-1) after BatchNorm calibration; oneDNN picks different kernels per
# batch size, so rows may differ in the last bits. Measured max |diff| here: 3e-7.
ATOL = 1e-5

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    return TorchVisionEngine("mobilenet_v2", device="cpu", max_batch_size=32)


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(7).standard_normal((32, 3, 224, 224), dtype=np.float32)


def test_output_same_alone_and_in_any_batch(engine, images):
    alone = np.stack([engine.infer({"input": images[i : i + 1]})["logits"][0] for i in range(32)])
    assert np.abs(alone).max() > 1e-2  # real activations, not vanishing random-init noise
    for size in (2, 3, 8, 17, 32):
        batch = engine.infer({"input": images[:size]})["logits"]
        np.testing.assert_allclose(batch, alone[:size], atol=ATOL, rtol=0)
    # distinct inputs give distinct outputs (no row mix-up could hide behind equal rows)
    assert np.abs(alone[0] - alone[1]).max() > 1e-3


def test_two_engines_same_seed_agree_other_seed_differs(engine, images):
    twin = TorchVisionEngine("mobilenet_v2", device="cpu")
    other = TorchVisionEngine("mobilenet_v2", device="cpu", seed=1)
    x = {"input": images[:2]}
    np.testing.assert_allclose(twin.infer(x)["logits"], engine.infer(x)["logits"], atol=ATOL, rtol=0)
    assert np.abs(other.infer(x)["logits"] - engine.infer(x)["logits"]).max() > 1e-3


def test_weights_from_a_local_checkpoint(tmp_path, images):
    model = load_torchvision_model("mobilenet_v2", None, seed=3)
    path = tmp_path / "ckpt.pt"
    torch.save({"state_dict": {"module." + k: v for k, v in model.state_dict().items()}}, path)
    loaded = TorchVisionEngine("mobilenet_v2", device="cpu", weights=str(path), channels_last=False,
                               fuse_conv_bn=False)  # fmt: skip
    with torch.inference_mode():
        expected = model.eval()(torch.from_numpy(images[:2])).numpy()
    np.testing.assert_allclose(loaded.infer({"input": images[:2]})["logits"], expected, atol=ATOL, rtol=0)
    with pytest.raises(FileNotFoundError):
        TorchVisionEngine("mobilenet_v2", device="cpu", weights=str(tmp_path / "missing.pt"))


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet50", "mobilenet_v3_large"])
def test_batchnorm_folding_keeps_the_answers(name, images):
    """Folded BatchNorm: no BatchNorm module is left to run, and the logits are the unfolded
    model's up to float rounding (folding reorders a multiply-add per channel: measured max
    |diff| 2e-5 on resnet50's O(1) logits)."""
    folded = TorchVisionEngine(name, device="cpu", channels_last=False)
    plain = TorchVisionEngine(name, device="cpu", channels_last=False, fuse_conv_bn=False)

    def norms(engine):
        return sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in engine.model.modules())

    assert norms(plain) > 0 and norms(folded) == 0
    x = {"input": images[:3]}
    expected = plain.infer(x)["logits"]
    np.testing.assert_allclose(
        folded.infer(x)["logits"], expected, atol=1e-4 * np.abs(expected).max(), rtol=0
    )


def test_a_model_fx_cannot_trace_is_served_unfolded(caplog):
    from wattserve.engines.torch_engine import fold_batchnorm

    class DataDependent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv(x)) if x.sum() > 0 else x  # control flow on a tensor

    model = DataDependent().eval()
    assert fold_batchnorm(model) is model
    assert "not folded" in caplog.text


def test_cuda_requested_without_gpu_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    from wattserve.engines.base import EngineError

    with pytest.raises(EngineError, match="no CUDA device"):
        TorchVisionEngine("mobilenet_v2", device="cuda")


@pytest.fixture(scope="module")
def mobilenet_server():
    settings = Settings(model="mobilenet_v2", batcher="dynamic", max_batch_size=4, max_queue_delay_ms=2)
    with threaded_server(settings) as (url, app):
        yield url, app


def test_served_model_matches_engine_through_triton_client(mobilenet_server, engine, images):
    url, _ = mobilenet_server
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    inp = triton.InferInput("input", [3, 3, 224, 224], "FP32")
    inp.set_data_from_numpy(images[:3], binary_data=True)
    result = client.infer("mobilenet_v2", [inp], outputs=[triton.InferRequestedOutput("logits")])
    expected = engine.infer({"input": images[:3]})["logits"]
    np.testing.assert_allclose(result.as_numpy("logits"), expected, atol=ATOL, rtol=0)


def test_image_upload_gets_top_k(mobilenet_server):
    url, _ = mobilenet_server
    pixels = np.random.default_rng(1).integers(0, 255, (300, 400, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    r = httpx.post(url + "/v2/models/mobilenet_v2/classify?top_k=3",
                   files={"file": ("cat.png", buf.getvalue(), "image/png")}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    top = r.json()["top_k"]
    assert len(top) == 3
    scores = [c["score"] for c in top]
    assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0 + 1e-9
    assert all(isinstance(c["label"], str) and 0 <= c["index"] < 1000 for c in top)
    raw = httpx.post(url + "/v2/models/mobilenet_v2/classify", content=buf.getvalue(),
                     headers={"content-type": "image/png"}, timeout=60)  # fmt: skip
    assert raw.json()["top_k"][0] == top[0]  # same image, same answer, either upload form
    preprocessors = [t.name for t in threading.enumerate() if t.name.startswith("preprocess")]
    assert preprocessors, "decoded on the preprocessing pool (no OpenMP team of its own)"
    bad = httpx.post(url + "/v2/models/mobilenet_v2/classify", files={"file": ("x.jpg", b"garbage")})
    assert bad.status_code == 400 and "unreadable image" in bad.json()["error"]
