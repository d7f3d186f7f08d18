"""The diffusion StepEngine: same seed and steps, same image, alone or in any batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers.utils.torch_utils import randn_tensor
from wattserve.engines.base import Engine, StepEngine
from wattserve.engines.diffusion import DiffusionEngine, tiny_unet

from tests.diffusion_support import quiet_cpu  # noqa: F401  (autouse fixture)

# Measured: < 1e-4 up to 50 DDIM steps (kernel float differences between batch sizes).
TOL = 1e-3


def item(seed: int, steps: int) -> dict[str, np.ndarray]:
    return {"seed": np.array([seed], np.int64), "steps": np.array([steps], np.int32)}


def batch(pairs: list[tuple[int, int]]) -> dict[str, np.ndarray]:
    return {
        "seed": np.array([[s] for s, _ in pairs], np.int64),
        "steps": np.array([[n] for _, n in pairs], np.int32),
    }


@pytest.fixture(scope="module")
def engine() -> DiffusionEngine:
    return DiffusionEngine(device="cpu", max_batch_size=8)


@pytest.fixture(scope="module")
def ddpm() -> DiffusionEngine:
    return DiffusionEngine(device="cpu", scheduler="ddpm", max_batch_size=8)


def alone(engine: DiffusionEngine, seed: int, steps: int) -> np.ndarray:
    return engine.infer(batch([(seed, steps)]))["image"][0]


def test_is_both_a_step_engine_and_an_engine(engine):
    assert isinstance(engine, StepEngine)
    assert isinstance(engine, Engine)
    assert [s.name for s in engine.inputs] == ["seed", "steps"]
    assert engine.outputs[0].shape == (3, 32, 32)


def test_image_shape_range_and_seed_dependence(engine):
    a, b = alone(engine, 1, 4), alone(engine, 2, 4)
    assert a.shape == (3, 32, 32) and a.dtype == np.float32
    assert a.min() >= 0.0 and a.max() <= 1.0
    assert np.abs(a - b).max() > 0.1  # different seeds, different images
    assert np.abs(alone(engine, 1, 4) - alone(engine, 1, 9)).max() > 0.01  # steps matter too


@pytest.mark.parametrize("fixture", ["engine", "ddpm"])
def test_same_seed_and_steps_same_image_alone_or_in_a_mixed_batch(fixture, request):
    eng: DiffusionEngine = request.getfixturevalue(fixture)
    pairs = [(11, 3), (12, 20), (13, 7), (11, 20), (14, 1), (15, 12)]
    together = eng.infer(batch(pairs))["image"]
    for (seed, steps), got in zip(pairs, together, strict=True):
        np.testing.assert_allclose(got, alone(eng, seed, steps), atol=TOL, rtol=0)
    # two requests with one seed but different steps in one batch stay distinct
    assert np.abs(together[0] - together[3]).max() > 0.01


def test_a_request_joining_midway_matches_its_solo_run(engine):
    """Iteration-level batching: states start at different iterations, ride with others."""
    first = engine.start(item(21, 10))
    for _ in range(4):
        engine.step([first])
    late = engine.start(item(22, 6))
    other = engine.start(item(23, 30))
    running = [first, late, other]
    while running:
        engine.step(running)
        running = [s for s in running if not engine.finished(s)]
    assert engine.finished(first) and engine.finished(late) and engine.finished(other)
    for state, (seed, steps) in ((first, (21, 10)), (late, (22, 6)), (other, (23, 30))):
        np.testing.assert_allclose(
            engine.result(state)["image"], alone(engine, seed, steps), atol=TOL, rtol=0
        )


def test_matches_a_plain_diffusers_loop(engine):
    """The engine's result equals UNet + the library's DDIM step() run on one sample."""
    seed, steps = 31, 8
    sched = engine.scheduler.base.__class__.from_config(engine.scheduler.base.config)
    sched.set_timesteps(steps)
    g = torch.Generator().manual_seed(seed)
    x = randn_tensor((1, 3, 32, 32), generator=g) * sched.init_noise_sigma
    with torch.inference_mode():
        for t in sched.timesteps:
            eps = engine.unet(x, t).sample
            x = sched.step(eps, t, x).prev_sample
    expected = (x[0] / 2 + 0.5).clamp(0, 1).numpy()
    np.testing.assert_allclose(alone(engine, seed, steps), expected, atol=1e-5, rtol=0)


def test_steps_zero_means_default_and_bad_requests_are_refused(engine):
    assert engine.parse(item(5, 0)) == (5, engine.default_steps)
    with pytest.raises(ValueError, match="seed"):
        engine.parse(item(-1, 5))
    with pytest.raises(ValueError, match="steps"):
        engine.parse(item(1, engine.max_steps + 1))
    with pytest.raises(ValueError, match="steps"):
        engine.start(item(1, -3))


def test_result_before_finish_and_step_after_finish_fail(engine):
    from wattserve.engines.base import EngineError

    s = engine.start(item(1, 2))
    with pytest.raises(EngineError):
        engine.result(s)
    engine.step([s])
    engine.step([s])
    with pytest.raises(EngineError):
        engine.step([s])


def test_observer_sees_each_unet_call_but_not_warmup(engine):
    calls: list[int] = []
    engine.step_observer = lambda n, _s: calls.append(n)
    try:
        engine.warmup([1, 3])
        assert calls == []
        engine.infer(batch([(1, 2), (2, 4), (3, 3)]))
        assert calls == [3, 3, 2, 1]  # occupancy falls as short requests finish
    finally:
        engine.step_observer = None


def test_loads_a_local_diffusers_folder(tmp_path, engine):
    """WATTSERVE_DIFFUSION_MODEL: a local pipeline folder (unet/ + scheduler/), no download."""
    tiny_unet(0).save_pretrained(tmp_path / "unet")
    engine.scheduler.base.save_pretrained(tmp_path / "scheduler")
    loaded = DiffusionEngine(model_path=tmp_path, device="cpu")
    # Same weights, two runs: float32 convolutions may sum in a different order from run to
    # run (thread scheduling), and 5 steps of a UNet compound that to ~1e-6 on pixels in
    # [0, 1] (1.07e-6 was seen). 1e-5 is ~80 float32 ulps at 1.0: a wrong load (other
    # weights or scheduler) moves pixels by far more than that.
    np.testing.assert_allclose(alone(loaded, 4, 5), alone(engine, 4, 5), atol=1e-5, rtol=0)
    # a bare UNet folder works too, with the default scheduler
    tiny_unet(1).save_pretrained(tmp_path / "bare")
    bare = DiffusionEngine(model_path=tmp_path / "bare", device="cpu")
    assert bare.outputs[0].shape == (3, 32, 32)


def test_missing_folder_is_a_clear_error(tmp_path):
    from wattserve.engines.base import EngineError

    with pytest.raises(EngineError, match="does not exist"):
        DiffusionEngine(model_path=tmp_path / "nope", device="cpu")
