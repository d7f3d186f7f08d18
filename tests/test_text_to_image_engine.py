"""The text-to-image step engine against diffusers' own StableDiffusionPipeline.

A lone request equals the pipeline's output under the same seed, steps and guidance (its
final latents to float tolerance, its 8-bit image to one level); a request's image does not
depend on what it was batched with (other prompts, guidance scales, step counts, sizes,
requests joining mid-way); bad fields are refused naming the field; other pipeline
families are refused at load naming what was found.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from wattserve.engines.base import EngineError, PreparesInputs, StepEngine
from wattserve.engines.text_to_image import TextToImageEngine

from tests.diffusion_support import quiet_cpu  # noqa: F401  (autouse fixture)
from tests.text_to_image_support import tiny_sd_path

LATENT_TOL = 1e-4  # batch-size float noise of the kernels, on latents of unit scale


@pytest.fixture(scope="module")
def tiny_sd() -> Path:
    return tiny_sd_path()


@pytest.fixture(scope="module")
def engine(tiny_sd: Path) -> TextToImageEngine:
    return TextToImageEngine("stable_diffusion", tiny_sd, device="cpu", default_steps=4)


def request(prompt: str, **values) -> dict[str, np.ndarray]:
    """One request's inputs without the batch axis, as StepEngine.start takes them."""
    out = {"prompt": np.array([prompt.encode()], dtype=object)}
    kinds = {
        "seed": np.int64,
        "steps": np.int32,
        "guidance_scale": np.float32,
        "height": np.int32,
        "width": np.int32,
    }
    for name, value in values.items():
        if name == "negative_prompt":
            out[name] = np.array([value.encode()], dtype=object)
        else:
            out[name] = np.array([value], kinds[name])
    return out


def run(engine: TextToImageEngine, states) -> None:
    active = list(states)
    while active:
        engine.step(active)
        active = [s for s in active if not engine.finished(s)]


def test_capabilities(engine: TextToImageEngine) -> None:
    assert isinstance(engine, StepEngine) and isinstance(engine, PreparesInputs)
    assert engine.default_size == (32, 32)


@pytest.mark.parametrize(
    ("guidance", "negative"),
    [(7.5, None), (3.0, "a blue house"), (1.0, None)],
    ids=["cfg", "negative", "no-cfg"],
)
def test_lone_request_equals_diffusers_pipeline(
    engine: TextToImageEngine, tiny_sd: Path, guidance, negative
) -> None:
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(tiny_sd, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    kwargs = dict(num_inference_steps=5, guidance_scale=guidance, negative_prompt=negative)
    latents = pipe(
        "a photo of a cat", generator=torch.Generator().manual_seed(11), output_type="latent", **kwargs
    )
    image = pipe("a photo of a cat", generator=torch.Generator().manual_seed(11), output_type="np", **kwargs)

    values = dict(seed=11, steps=5, guidance_scale=guidance)
    if negative is not None:
        values["negative_prompt"] = negative
    state = engine.start(request("a photo of a cat", **values))
    run(engine, [state])
    np.testing.assert_allclose(state.latents.numpy(), latents.images.numpy(), atol=LATENT_TOL, rtol=0)
    want = (image.images[0] * 255).round().astype(np.uint8)
    got = engine.result(state)["image"]
    assert got.shape == want.shape == (32, 32, 3) and got.dtype == np.uint8
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert want.std() > 5  # not a flat image: the comparison means something


def test_image_does_not_depend_on_company(engine: TextToImageEngine) -> None:
    """One request alone, then amid others (other prompts, guidance, steps, a second size,
    some joining mid-way, finishing on other steps)."""
    mine = request("a red chair", seed=5, steps=6, guidance_scale=6.0)
    alone = engine.start(mine)
    run(engine, [alone])

    me = engine.start(mine)
    others = [
        engine.start(request("a dog in the snow", seed=1, steps=3, guidance_scale=9.0)),
        engine.start(request("the moon", seed=2, steps=8, guidance_scale=1.0)),
        engine.start(request("a horse", seed=3, steps=4, height=32, width=48)),
    ]
    engine.step([others[0], others[2]])  # two steps ahead of me
    engine.step([others[0], others[2]])
    late = engine.start(request("a blue house", seed=4, steps=5, guidance_scale=4.0))
    active = [me, *others]
    for i in range(12):
        if i == 2:
            active.append(late)
        engine.step(active)
        active = [s for s in active if not engine.finished(s)]
    assert not active
    np.testing.assert_allclose(me.latents.numpy(), alone.latents.numpy(), atol=LATENT_TOL, rtol=0)
    diff = np.abs(engine.result(me)["image"].astype(int) - engine.result(alone)["image"].astype(int))
    assert diff.max() <= 1
    assert engine.result(others[2])["image"].shape == (32, 48, 3)


def test_infer_runs_the_same_pipeline(engine: TextToImageEngine) -> None:
    """The request-level contract (static/dynamic) gives the step contract's images."""
    specs = [("a cat", 7, 3, 7.5), ("a dog", 8, 5, 2.0)]
    rows = [engine.prepare({k: v[np.newaxis] for k, v in request(p, seed=s, steps=n, guidance_scale=g).items()})[0]
            for p, s, n, g in specs]  # fmt: skip
    batch = {name: np.concatenate([r[name] for r in rows]) for name in rows[0]}
    images = engine.infer(batch)["image"]
    assert images.shape == (2, 32, 32, 3)
    for (p, s, n, g), image in zip(specs, images, strict=True):
        state = engine.start(request(p, seed=s, steps=n, guidance_scale=g))
        run(engine, [state])
        assert np.abs(image.astype(int) - engine.result(state)["image"].astype(int)).max() <= 1


def test_prepare_fills_defaults_and_keys_by_size(engine: TextToImageEngine) -> None:
    filled, key = engine.prepare({"prompt": np.array([[b"a cat"]], dtype=object)})
    assert set(filled) == {s.name for s in engine.inputs}
    assert filled["negative_prompt"][0, 0] == b"" and filled["steps"][0, 0] == 4
    assert filled["guidance_scale"][0, 0] == np.float32(7.5) and filled["height"][0, 0] == 32
    assert key == (16, 16)
    _, key = engine.prepare(
        {"prompt": np.array([[b"a cat"]], dtype=object), "width": np.array([[48]], np.int32)}
    )
    assert key == (16, 24)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", np.array([[-1]], np.int64)),
        ("steps", np.array([[5000]], np.int32)),
        ("guidance_scale", np.array([[np.nan]], np.float32)),
        ("guidance_scale", np.array([[-2.0]], np.float32)),
        ("height", np.array([[60]], np.int32)),
        ("width", np.array([[4096]], np.int32)),
        ("prompt", np.array([[b"\xff\xfe"]], dtype=object)),
        ("negative_prompt", np.array([[b"x" * 20000]], dtype=object)),
    ],
)
def test_bad_values_name_the_field(engine: TextToImageEngine, field: str, value: np.ndarray) -> None:
    inputs = {"prompt": np.array([[b"a cat"]], dtype=object), field: value}
    with pytest.raises(ValueError, match=field):
        engine.prepare(inputs)


def test_missing_prompt_and_two_rows_refused(engine: TextToImageEngine) -> None:
    with pytest.raises(ValueError, match="prompt"):
        engine.prepare({"seed": np.array([[1]], np.int64)})
    with pytest.raises(ValueError, match="one image per request"):
        engine.prepare({"prompt": np.array([[b"a"], [b"b"]], dtype=object)})


def test_other_pipeline_families_refused(tiny_sd: Path, tmp_path: Path) -> None:
    other = tmp_path / "sdxl"
    shutil.copytree(tiny_sd, other)
    index = json.loads((other / "model_index.json").read_text())
    index["_class_name"] = "StableDiffusionXLPipeline"
    (other / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(EngineError, match="StableDiffusionXLPipeline"):
        TextToImageEngine("sdxl", other, device="cpu")
    with pytest.raises(EngineError, match=r"no model_index\.json"):
        TextToImageEngine("unet", other / "unet", device="cpu")
