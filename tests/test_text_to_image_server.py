"""Text-to-image Stable Diffusion through a real server on loopback (tiny random pipeline).

The built-in (``WATTSERVE_MODEL=stable_diffusion`` + ``WATTSERVE_DIFFUSION_MODEL``) answers a
prompt over HTTP JSON, HTTP binary (tritonclient.http), gRPC (tritonclient.grpc) and the PNG
route, each image equal to the engine run alone; bad fields get a 400 naming the field.
A repository entry serves the same model; concurrent requests under the iteration-level
and the dynamic batcher each get their own image, whatever they were batched with.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from wattserve.engines.text_to_image import TextToImageEngine
from wattserve.loadgen.server_process import free_port
from wattserve.server.settings import Settings

from tests.diffusion_support import quiet_cpu  # noqa: F401  (autouse fixture)
from tests.servers import threaded_server
from tests.text_to_image_support import tiny_sd_path

MODEL = "stable_diffusion"
STEPS = 3


@pytest.fixture(scope="module")
def reference() -> TextToImageEngine:
    """The served pipeline, run alone in the test process."""
    return TextToImageEngine(MODEL, tiny_sd_path(), device="cpu", default_steps=STEPS)


def solo(engine: TextToImageEngine, prompt: str, **values) -> np.ndarray:
    inputs = {"prompt": np.array([[prompt.encode()]], dtype=object)}
    for name, value in values.items():
        inputs[name] = np.array([[value]], np.float32 if name == "guidance_scale" else np.int64)
    filled, _ = engine.prepare(inputs)
    return engine.infer(filled)["image"][0]


def close(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and int(np.abs(a.astype(int) - b.astype(int)).max()) <= 1


def json_body(prompt: str | None, **values) -> dict:
    inputs = (
        [] if prompt is None else [{"name": "prompt", "shape": [1, 1], "datatype": "BYTES", "data": [prompt]}]
    )
    types = {"seed": "INT64", "steps": "INT32", "guidance_scale": "FP32", "height": "INT32", "width": "INT32"}
    for name, value in values.items():
        inputs.append({"name": name, "shape": [1, 1], "datatype": types[name], "data": [value]})
    return {"inputs": inputs}


def image_of(doc: dict) -> np.ndarray:
    out = doc["outputs"][0]
    assert out["name"] == "image" and out["datatype"] == "UINT8"
    return np.asarray(out["data"], np.uint8).reshape(out["shape"])[0]


@pytest.fixture(scope="module")
def builtin() -> Iterator[tuple[str, int]]:
    grpc_port = free_port()
    settings = Settings(model=MODEL, diffusion_model=tiny_sd_path(), diffusion_default_steps=STEPS,
                        batcher="continuous", max_batch_size=4, torch_threads=1, grpc_port=grpc_port,
                        log_level="warning")  # fmt: skip
    with threaded_server(settings) as (url, _app):
        yield url, grpc_port


def test_metadata(builtin) -> None:
    url, _ = builtin
    meta = httpx.get(f"{url}/v2/models/{MODEL}").json()
    assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [
        ("prompt", "BYTES"), ("negative_prompt", "BYTES"), ("seed", "INT64"), ("steps", "INT32"),
        ("guidance_scale", "FP32"), ("height", "INT32"), ("width", "INT32"),
    ]  # fmt: skip
    assert meta["outputs"] == [{"name": "image", "datatype": "UINT8", "shape": [-1, -1, -1, 3]}]


def test_http_json_prompt_only(builtin, reference) -> None:
    url, _ = builtin
    r = httpx.post(f"{url}/v2/models/{MODEL}/infer", json=json_body("a photo of a cat"), timeout=60)
    assert r.status_code == 200, r.text
    image = image_of(r.json())
    assert image.shape == (32, 32, 3)
    assert close(image, solo(reference, "a photo of a cat"))


def test_http_binary_and_grpc(builtin, reference) -> None:
    url, grpc_port = builtin
    want = solo(reference, "a dog in the snow", seed=9, steps=4, guidance_scale=5.0, height=48, width=32)

    def tensors(mod):
        out = [mod.InferInput("prompt", [1, 1], "BYTES")]
        out[0].set_data_from_numpy(np.array([[b"a dog in the snow"]], dtype=object))
        for name, value, dtype, kind in [("seed", 9, np.int64, "INT64"), ("steps", 4, np.int32, "INT32"),
                                         ("guidance_scale", 5.0, np.float32, "FP32"),
                                         ("height", 48, np.int32, "INT32"), ("width", 32, np.int32, "INT32")]:  # fmt: skip
            t = mod.InferInput(name, [1, 1], kind)
            t.set_data_from_numpy(np.array([[value]], dtype))
            out.append(t)
        return out

    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    outputs = [httpclient.InferRequestedOutput("image", binary_data=True)]
    got = client.infer(MODEL, tensors(httpclient), outputs=outputs).as_numpy("image")
    assert got.dtype == np.uint8 and got.shape == (1, 48, 32, 3)
    assert close(got[0], want)

    gclient = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    got = gclient.infer(MODEL, tensors(grpcclient)).as_numpy("image")
    assert got.shape == (1, 48, 32, 3) and close(got[0], want)
    with pytest.raises(grpcclient.InferenceServerException, match="guidance_scale"):
        bad = tensors(grpcclient)
        bad[3].set_data_from_numpy(np.array([[500.0]], np.float32))
        gclient.infer(MODEL, bad)


def test_png_route(builtin, reference) -> None:
    from PIL import Image

    url, _ = builtin
    params = {"prompt": "a red chair", "seed": 4, "guidance_scale": 3.0, "scale": 2}
    r = httpx.get(f"{url}/v2/models/{MODEL}/generate", params=params, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    picture = np.asarray(Image.open(io.BytesIO(r.content)))
    assert picture.shape == (64, 64, 3)
    assert close(picture[::2, ::2], solo(reference, "a red chair", seed=4, guidance_scale=3.0))
    bad = httpx.get(f"{url}/v2/models/{MODEL}/generate", params={"prompt": "x", "height": 60}, timeout=60)
    assert bad.status_code == 400 and "height" in bad.text


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (json_body("a cat", steps=5000), "steps"),
        (json_body("a cat", seed=-1), "seed"),
        (json_body("a cat", guidance_scale=-1.0), "guidance_scale"),
        (json_body("a cat", height=60), "height"),
        (json_body("a cat", width=4096), "width"),
        (json_body(None, seed=1), "prompt"),
    ],
)
def test_bad_fields_400(builtin, body: dict, field: str) -> None:
    url, _ = builtin
    r = httpx.post(f"{url}/v2/models/{MODEL}/infer", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]


REPO_CONFIG = """
backend: "wattserve"
max_batch_size: 4
{batching}
parameters {{ key: "builtin" value: {{ string_value: "stable_diffusion" }} }}
parameters {{ key: "diffusion_model" value: {{ string_value: "{path}" }} }}
parameters {{ key: "diffusion_default_steps" value: {{ string_value: "3" }} }}
"""


def test_repository_iteration_and_dynamic_batch_independent(tmp_path: Path, reference) -> None:
    """Concurrent mixed requests (prompts, guidance, steps, two sizes): each its own image,
    under iteration-level and request-level (dynamic) batching alike."""
    batchings = {
        "sd_iter": 'parameters { key: "batcher" value: { string_value: "continuous" } }',
        "sd_dyn": "dynamic_batching { max_queue_delay_microseconds: 30000 }",
    }
    for name, batching in batchings.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(
            REPO_CONFIG.format(batching=batching, path=tiny_sd_path())
        )
    specs = [("a cat", dict(seed=1, steps=2)), ("a dog", dict(seed=2, steps=5, guidance_scale=2.0)),
             ("the moon", dict(seed=3, steps=3, guidance_scale=1.0)), ("a horse", dict(seed=4, height=48)),
             ("a house", dict(seed=5, steps=4, height=48)), ("a fox", dict(seed=6, steps=3))]  # fmt: skip
    wants = [solo(reference, p, **v) for p, v in specs]
    settings = Settings(model_repository=tmp_path, torch_threads=1, log_level="warning")

    async def fire(url: str, model: str) -> list[tuple[int, dict]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

            async def one(i: int, prompt: str, values: dict):
                await asyncio.sleep(0.02 * i)
                async with session.post(
                    f"{url}/v2/models/{model}/infer", json=json_body(prompt, **values)
                ) as r:
                    return r.status, await r.json(), r.headers.get("x-batch-size")

            return await asyncio.gather(*(one(i, p, v) for i, (p, v) in enumerate(specs)))

    with threaded_server(settings) as (url, _app):
        for model in batchings:
            answers = asyncio.run(fire(url, model))
            for (status, doc, _), want in zip(answers, wants, strict=True):
                assert status == 200, doc
                assert close(image_of(doc), want)
            assert max(int(b) for _, _, b in answers) > 1, f"{model}: nothing was batched"
