"""Scheduler math for a batch whose samples sit at different timesteps.

diffusers' ``DDIMScheduler.step`` and ``DDPMScheduler.step`` (0.42) take one scalar
timestep for the whole batch, and their ``set_timesteps`` makes one schedule for one step
count. Iteration-level batching mixes requests with different step counts at different
points of their schedules in one UNet call, so the update is computed here per sample, from
the scheduler's own tables (``alphas_cumprod``, ``final_alpha_cumprod``/``one``, each
request's own ``set_timesteps(steps)``), with exactly the formulas of the library's
``step()``. ``tests/test_diffusion_scheduler.py`` checks the result against ``step()`` run
one sample at a time.

Supported: DDIM (any eta; eta > 0 draws noise from each request's own generator) and DDPM
(variance types fixed_small, fixed_small_log, fixed_large), prediction types epsilon,
sample and v_prediction, clipping and dynamic thresholding. Anything else is refused when
the scheduler is wrapped, never silently approximated.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch
from diffusers import DDIMScheduler, DDPMScheduler
from diffusers.utils.torch_utils import randn_tensor

SUPPORTED_PREDICTIONS = ("epsilon", "sample", "v_prediction")
SUPPORTED_DDPM_VARIANCE = ("fixed_small", "fixed_small_log", "fixed_large")


@dataclass(frozen=True)
class Schedule:
    """One request's timesteps and, for each, the timestep its update goes to (-1: the end)."""

    timesteps: tuple[int, ...]
    prev_timesteps: tuple[int, ...]


def make_scheduler(kind: str, config: dict | None = None) -> DDIMScheduler | DDPMScheduler:
    """A fresh diffusers scheduler of ``kind`` ("ddim" or "ddpm"), from a config if given."""
    cls = {"ddim": DDIMScheduler, "ddpm": DDPMScheduler}[kind]
    return cls.from_config(config) if config else cls()


class PerSampleScheduler:
    """Wraps one diffusers DDIM/DDPM scheduler; steps a batch with per-sample timesteps."""

    def __init__(self, scheduler: DDIMScheduler | DDPMScheduler, eta: float = 0.0) -> None:
        if not isinstance(scheduler, DDIMScheduler | DDPMScheduler):
            raise TypeError(f"only DDIM and DDPM schedulers are supported, got {type(scheduler).__name__}")
        cfg = scheduler.config
        if cfg.prediction_type not in SUPPORTED_PREDICTIONS:
            raise ValueError(f"prediction_type {cfg.prediction_type!r} not supported")
        if isinstance(scheduler, DDPMScheduler) and cfg.variance_type not in SUPPORTED_DDPM_VARIANCE:
            raise ValueError(
                f"DDPM variance_type {cfg.variance_type!r} not supported (learned variances need "
                f"a UNet with twice the output channels); use one of {SUPPORTED_DDPM_VARIANCE}"
            )
        self.base = scheduler
        self.is_ddim = isinstance(scheduler, DDIMScheduler)
        self.eta = float(eta) if self.is_ddim else 1.0  # DDPM is always stochastic
        self.num_train_timesteps = int(cfg.num_train_timesteps)
        self.init_noise_sigma = float(scheduler.init_noise_sigma)
        self.alphas_cumprod = scheduler.alphas_cumprod.to(torch.float32)
        # The alpha product "before" timestep 0 (prev_t < 0), exactly as step() picks it.
        end = scheduler.final_alpha_cumprod if self.is_ddim else scheduler.one
        self.end_alpha_cumprod = torch.as_tensor(end, dtype=torch.float32)
        self._schedule = lru_cache(maxsize=1024)(self._make_schedule)

    @property
    def stochastic(self) -> bool:
        """Whether an update draws noise (then each sample's own generator supplies it)."""
        return self.eta > 0

    def schedule(self, steps: int) -> Schedule:
        """The timesteps ``set_timesteps(steps)`` gives, cached per step count."""
        if not 1 <= steps <= self.num_train_timesteps:
            raise ValueError(f"steps must be in 1..{self.num_train_timesteps}, got {steps}")
        return self._schedule(int(steps))

    def _make_schedule(self, steps: int) -> Schedule:
        sched = copy.deepcopy(self.base)  # set_timesteps mutates; the base stays untouched
        sched.set_timesteps(steps)
        ts = [int(t) for t in sched.timesteps]
        # DDIMScheduler.step: prev = t - T // steps, whatever the spacing.
        # DDPMScheduler.previous_timestep: the next entry of the schedule, -1 after the last.
        ddim_prev = [t - self.num_train_timesteps // steps for t in ts]
        prev = ddim_prev if self.is_ddim else [*ts[1:], -1]
        return Schedule(tuple(ts), tuple(prev))

    def _alpha_prod(self, t: torch.Tensor) -> torch.Tensor:
        table = self.alphas_cumprod
        safe = t.clamp(min=0)
        return torch.where(t >= 0, table[safe], self.end_alpha_cumprod)

    def step(
        self,
        model_output: torch.Tensor,
        timesteps: Sequence[int],
        prev_timesteps: Sequence[int],
        sample: torch.Tensor,
        generators: Sequence[torch.Generator | None] | None = None,
    ) -> torch.Tensor:
        """One update for a batch; row ``i`` goes from ``timesteps[i]`` to ``prev_timesteps[i]``.

        ``model_output`` and ``sample`` are [B, C, H, W]. Returns the previous sample, [B, C, H, W],
        in ``sample``'s dtype. Noise (DDPM, DDIM with eta > 0) comes from ``generators[i]``.
        """
        n = sample.shape[0]
        if not len(timesteps) == len(prev_timesteps) == n == model_output.shape[0]:
            raise ValueError("one timestep, previous timestep and model output per sample")
        cfg = self.base.config
        dtype = sample.dtype
        shape = (n, *([1] * (sample.dim() - 1)))
        t = torch.as_tensor(list(timesteps), dtype=torch.long)
        prev = torch.as_tensor(list(prev_timesteps), dtype=torch.long)
        a_t = self.alphas_cumprod[t].to(sample.device).view(shape)
        a_prev = self._alpha_prod(prev).to(sample.device).view(shape)
        b_t = 1 - a_t

        x, eps_in = sample.float(), model_output.float()
        if cfg.prediction_type == "epsilon":
            x0 = (x - b_t**0.5 * eps_in) / a_t**0.5
            eps = eps_in
        elif cfg.prediction_type == "sample":
            x0 = eps_in
            eps = (x - a_t**0.5 * x0) / b_t**0.5
        else:  # v_prediction
            x0 = (a_t**0.5) * x - (b_t**0.5) * eps_in
            eps = (a_t**0.5) * eps_in + (b_t**0.5) * x

        if cfg.thresholding:
            x0 = self.base._threshold_sample(x0)  # row-wise already: each sample its own quantile
        elif cfg.clip_sample:
            x0 = x0.clamp(-cfg.clip_sample_range, cfg.clip_sample_range)

        if self.is_ddim:
            std = self._ddim_std(a_t, a_prev, b_t)
            out = a_prev**0.5 * x0 + (1 - a_prev - std**2) ** 0.5 * eps
        else:
            out = self._ddpm(x, x0, a_t, a_prev, b_t)
        if self.stochastic:
            out = out + self._noise_term(model_output, t, a_t, a_prev, generators)
        return out.to(dtype)

    def _ddim_std(self, a_t: torch.Tensor, a_prev: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
        """DDIM's sigma_t(eta), formula (16)."""
        variance = ((1 - a_prev) / b_t) * (1 - a_t / a_prev)
        return self.eta * variance**0.5

    @staticmethod
    def _ddpm(x: torch.Tensor, x0: torch.Tensor, a_t: torch.Tensor, a_prev: torch.Tensor, b_t: torch.Tensor):
        """DDPM posterior mean, formula (7) of the DDPM paper, as DDPMScheduler.step computes it."""
        alpha_t = a_t / a_prev
        beta_t = 1 - alpha_t
        x0_coeff = (a_prev**0.5 * beta_t) / b_t
        x_coeff = alpha_t**0.5 * (1 - a_prev) / b_t
        return x0_coeff * x0 + x_coeff * x

    def _ddpm_scale(self, a_t: torch.Tensor, a_prev: torch.Tensor) -> torch.Tensor:
        """What DDPMScheduler.step multiplies its noise by, per variance type."""
        beta_t = 1 - a_t / a_prev
        variance = ((1 - a_prev) / (1 - a_t) * beta_t).clamp(min=1e-20)
        kind = self.base.config.variance_type
        if kind == "fixed_small":
            return variance**0.5
        if kind == "fixed_small_log":
            return torch.exp(0.5 * torch.log(variance))
        return beta_t**0.5  # fixed_large

    def _noise_term(
        self,
        model_output: torch.Tensor,
        t: torch.Tensor,
        a_t: torch.Tensor,
        a_prev: torch.Tensor,
        generators: Sequence[torch.Generator | None] | None,
    ) -> torch.Tensor:
        """Per-sample noise from each sample's own generator, drawn as step() draws it."""
        n = model_output.shape[0]
        gens = list(generators) if generators is not None else [None] * n
        if len(gens) != n:
            raise ValueError("one generator per sample")
        rows = []
        shape = (1, *model_output.shape[1:])
        for i in range(n):
            if not self.is_ddim and int(t[i]) <= 0:
                rows.append(torch.zeros(shape, device=model_output.device))  # DDPM: no noise at t=0
                continue
            rows.append(
                randn_tensor(shape, generator=gens[i], device=model_output.device, dtype=model_output.dtype)
            )
        noise = torch.cat(rows).float()
        scale = self._ddim_std(a_t, a_prev, 1 - a_t) if self.is_ddim else self._ddpm_scale(a_t, a_prev)
        return scale * noise
