"""examples/image_classification: Triton's image-classification ensemble (Python preprocess ->
ONNX classifier -> Python postprocess) served from the example's own repository and called
with the example's own client (tritonclient, HTTP and gRPC)."""

from __future__ import annotations

import io
import runpy
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "image_classification"
LABELS = (EXAMPLE / "model_repository" / "postprocess" / "labels.txt").read_text().split()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = runpy.run_path(str(EXAMPLE / "build_repository.py"))["build"](
        tmp_path_factory.mktemp("ic") / "repo"
    )
    client = runpy.run_path(str(EXAMPLE / "client.py"))
    settings = Settings(model_repository=repo, grpc_port=free_port(), telemetry=False, warmup=False)
    with threaded_server(settings) as (url, app):
        yield client, url.removeprefix("http://"), f"127.0.0.1:{app.state.grpc.port}"


def noise_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    pixels = np.random.default_rng(1).integers(0, 256, (40, 70, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def parse(label: str) -> tuple[float, int, str]:
    score, index, name = label.split(":")
    return float(score), int(index), name


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_ensemble_returns_top_k_labels(served, protocol):
    client, http_url, grpc_url = served
    images = [client["sample_image"](), noise_png()]
    url = grpc_url if protocol == "grpc" else http_url
    answers = client["classify"](url, images, "image_classifier", protocol == "grpc")
    assert len(answers) == 2
    for labels in answers:
        parsed = [parse(label) for label in labels]
        assert len(parsed) == 3
        scores = [s for s, _, _ in parsed]
        assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1.0 + 1e-5
        assert all(LABELS[i] == name for _, i, name in parsed)
    # the same pipeline in one Python model gives the same classes and (nearly) the same scores
    baseline = client["classify"](url, images, "image_classifier_python", protocol == "grpc")
    for ours, theirs in zip(answers, baseline, strict=True):
        assert [parse(x)[1] for x in ours] == [parse(x)[1] for x in theirs]
        np.testing.assert_allclose([parse(x)[0] for x in ours], [parse(x)[0] for x in theirs], atol=1e-5)


def test_an_image_that_does_not_decode_fails_in_the_preprocess_step(served):
    client, http_url, _ = served
    with pytest.raises(InferenceServerException) as info:
        client["classify"](http_url, [b"not an image"])
    assert info.value.status() == "400"
    assert "step 0 (model 'preprocess')" in info.value.message()
    assert "cannot decode the image" in info.value.message()
    # and the pipeline still serves
    assert len(client["classify"](http_url, [client["sample_image"]()])[0]) == 3
    assert thttp.InferenceServerClient(http_url).is_model_ready("image_classifier")
