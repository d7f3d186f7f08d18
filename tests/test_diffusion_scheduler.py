"""The per-sample scheduler update equals diffusers' own step(), run one sample at a time."""

from __future__ import annotations

import copy

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler
from wattserve.engines.schedulers import PerSampleScheduler, make_scheduler

STEPS = (1, 3, 10, 20, 50, 7)  # one request each, all in one batch


def _batch(per: PerSampleScheduler, position: float, seed: int = 0):
    """A batch of random samples/model outputs, each request at its own point of its schedule."""
    g = torch.Generator().manual_seed(seed)
    sample = torch.randn(len(STEPS), 3, 8, 8, generator=g) * 2
    model_output = torch.randn(len(STEPS), 3, 8, 8, generator=g)
    idx = [min(int(position * n), n - 1) for n in STEPS]
    t = [per.schedule(n).timesteps[i] for n, i in zip(STEPS, idx, strict=True)]
    prev = [per.schedule(n).prev_timesteps[i] for n, i in zip(STEPS, idx, strict=True)]
    return sample, model_output, t, prev


def _library_one_by_one(base, sample, model_output, t, eta, seeds):
    rows = []
    for i, n in enumerate(STEPS):
        sched = copy.deepcopy(base)
        sched.set_timesteps(n)
        kwargs = {"generator": torch.Generator().manual_seed(seeds[i])}
        if isinstance(sched, DDIMScheduler):
            kwargs["eta"] = eta
        out = sched.step(model_output[i : i + 1], t[i], sample[i : i + 1], **kwargs)
        rows.append(out.prev_sample)
    return torch.cat(rows)


CASES = [
    ("ddim", {}, 0.0),
    ("ddim", {"timestep_spacing": "trailing"}, 0.0),
    ("ddim", {"timestep_spacing": "linspace", "clip_sample": False}, 0.0),
    ("ddim", {"prediction_type": "v_prediction", "set_alpha_to_one": False}, 0.0),
    ("ddim", {"prediction_type": "sample", "steps_offset": 1}, 0.0),
    ("ddim", {"thresholding": True, "sample_max_value": 1.5}, 0.0),
    ("ddim", {"beta_schedule": "squaredcos_cap_v2"}, 0.7),
    ("ddim", {}, 1.0),
    ("ddpm", {}, None),
    ("ddpm", {"variance_type": "fixed_large"}, None),
    ("ddpm", {"variance_type": "fixed_small_log", "timestep_spacing": "trailing"}, None),
    ("ddpm", {"prediction_type": "v_prediction", "clip_sample": False}, None),
    ("ddpm", {"beta_schedule": "scaled_linear", "timestep_spacing": "linspace"}, None),
]


@pytest.mark.parametrize(("kind", "config", "eta"), CASES)
@pytest.mark.parametrize("position", [0.0, 0.5, 1.0])  # first step, middle, last step
def test_batched_update_equals_library_step_per_sample(kind, config, eta, position):
    base = {"ddim": DDIMScheduler, "ddpm": DDPMScheduler}[kind](**config)
    for key, value in config.items():
        assert base.config[key] == value
    per = PerSampleScheduler(base, eta=eta or 0.0)
    sample, model_output, t, prev = _batch(per, position)
    if position < 1.0:  # at the last step every schedule may end at the same timestep
        assert len(set(zip(t, prev, strict=True))) > 1, "the batch must mix steps"
    seeds = list(range(100, 100 + len(STEPS)))

    expected = _library_one_by_one(base, sample, model_output, t, eta or 0.0, seeds)
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    got = per.step(model_output, t, prev, sample, gens)

    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_schedule_matches_set_timesteps_and_step_prev():
    for kind, cls in (("ddim", DDIMScheduler), ("ddpm", DDPMScheduler)):
        per = PerSampleScheduler(make_scheduler(kind))
        for n in STEPS:
            ref = cls()
            ref.set_timesteps(n)
            sched = per.schedule(n)
            assert list(sched.timesteps) == [int(t) for t in ref.timesteps]
            assert len(sched.prev_timesteps) == n
            assert sched.prev_timesteps[-1] < 0  # the last step goes to the end of the chain


def test_base_scheduler_is_not_mutated_by_schedules():
    base = make_scheduler("ddim")
    per = PerSampleScheduler(base)
    per.schedule(5)
    per.schedule(17)
    assert base.num_inference_steps is None


def test_refuses_what_it_cannot_compute_exactly():
    with pytest.raises(ValueError, match="variance_type"):
        PerSampleScheduler(DDPMScheduler(variance_type="learned_range"))
    with pytest.raises(TypeError):
        from diffusers import EulerDiscreteScheduler

        PerSampleScheduler(EulerDiscreteScheduler())
    per = PerSampleScheduler(make_scheduler("ddim"))
    with pytest.raises(ValueError, match="steps"):
        per.schedule(0)
    with pytest.raises(ValueError, match="steps"):
        per.schedule(1001)
