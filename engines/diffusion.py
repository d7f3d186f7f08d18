"""A diffusion StepEngine on diffusers: UNet2DModel + a DDIM (or DDPM) scheduler.

One request = one image: inputs ``seed`` (INT64 [1]) and ``steps`` (INT32 [1]; 0 means the
configured default), output ``image`` (FP32 [C, H, W], values in [0, 1]). The engine offers
both contracts:

- step-level (``start``/``step``/``finished``/``result``) for the iteration-level batcher:
  one ``step`` is one batched UNet call with every state at its own timestep, followed by
  the per-sample scheduler update of ``engines.schedulers``;
- request-level (``infer``) for the static and dynamic batchers: all items of the batch
  run together, each with its own seed and step count; items with fewer steps leave the
  UNet batch as they finish.

Determinism: each request's initial noise (and any scheduler noise) comes from its own CPU
``torch.Generator`` seeded with its seed, and the scheduler math is per sample, so the same
seed and steps give the same image alone or in any batch -- up to the float differences of
the UNet's kernels at different batch sizes (on [0, 1]: measured below 1e-4 up to
50 DDIM steps, 2.3e-4 at 100, below 1e-6 with DDPM; tests allow 1e-3).

The default model is a tiny UNet2DModel (32x32 RGB, about 1.1 M parameters) with random
weights from a fixed seed: it runs offline, in about 10 ms per step at batch 1 on a 2-core
CPU. ``model_path`` loads a local diffusers folder instead (a UNet folder, or a pipeline
folder with ``unet/`` and ``scheduler/``); nothing is ever downloaded.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from time import monotonic
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from wattserve.engines.base import EngineError, StepObserver, TensorSpec
from wattserve.engines.schedulers import PerSampleScheduler, Schedule, make_scheduler
from wattserve.engines.torch_engine import resolve_device

if TYPE_CHECKING:  # diffusers is imported when a model is built (it takes seconds)
    from diffusers import UNet2DModel

log = logging.getLogger("wattserve.engine.diffusion")

# Small enough to run in ~10 ms/step on this CPU, large enough that batching pays
# (batch 8 costs ~3x batch 1 here, not 8x).
TINY_UNET_CONFIG: dict[str, Any] = {
    "sample_size": 32,
    "in_channels": 3,
    "out_channels": 3,
    "layers_per_block": 1,
    "block_out_channels": (32, 64, 64),
    "down_block_types": ("DownBlock2D", "DownBlock2D", "AttnDownBlock2D"),
    "up_block_types": ("AttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
    "norm_num_groups": 8,
}

SEED_SPEC = TensorSpec("seed", (1,), "INT64")
STEPS_SPEC = TensorSpec("steps", (1,), "INT32")

# The random network's output layer is scaled down (ADM/guided-diffusion zero-initialises it).
# At full scale a random UNet makes DDIM's deterministic trajectory chaotic: the ~1e-6
# differences between the CPU kernels at batch 1 and batch 8 grew to 0.8 (on [0, 1]) after
# 50 steps. Scaled by 0.1 they stay below 1e-4; the compute per step is unchanged.
TINY_OUTPUT_SCALE = 0.1


@dataclass(eq=False)
class DiffusionState:
    """One request in flight: its own noise, generator and position in its own schedule."""

    seed: int
    steps: int
    schedule: Schedule
    sample: torch.Tensor  # [1, C, H, W], float32, on the engine's device
    generator: torch.Generator
    index: int = 0  # steps done so far


def tiny_unet(seed: int = 0) -> UNet2DModel:
    """The default model: TINY_UNET_CONFIG with random weights drawn from ``seed``."""
    from diffusers import UNet2DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        unet = UNet2DModel(**TINY_UNET_CONFIG)
    with torch.no_grad():
        unet.conv_out.weight.mul_(TINY_OUTPUT_SCALE)
        unet.conv_out.bias.mul_(TINY_OUTPUT_SCALE)
    return unet


def load_local(path: Path, scheduler_kind: str) -> tuple[UNet2DModel, dict | None]:
    """A UNet2DModel (and its scheduler config, if the folder has one) from a local folder."""
    from diffusers import UNet2DModel

    path = Path(path)
    if not path.is_dir():
        raise EngineError(f"diffusion model folder {path} does not exist")
    subfolder = "unet" if (path / "unet" / "config.json").is_file() else None
    unet = UNet2DModel.from_pretrained(path, subfolder=subfolder, local_files_only=True)
    sched_cfg = path / "scheduler" / "scheduler_config.json"
    config = None
    if sched_cfg.is_file():
        cls = type(make_scheduler(scheduler_kind))
        config = cls.load_config(path, subfolder="scheduler", local_files_only=True)
    return unet, config


class DiffusionEngine:
    """Unconditional image diffusion, batched per step. Blocking; one caller thread."""

    platform = "diffusers"

    def __init__(
        self,
        name: str = "tiny_unet",
        *,
        model_path: Path | str | None = None,
        scheduler: str = "ddim",
        eta: float = 0.0,
        device: str = "auto",
        seed: int = 0,
        fp16: bool = False,
        max_batch_size: int = 8,
        default_steps: int = 20,
        max_steps: int = 1000,
        threads: int | None = None,
    ) -> None:
        self.name = name
        self._device = resolve_device(device)
        self.device = str(self._device)
        if threads is not None and self._device.type == "cpu":
            torch.set_num_threads(threads)
        if model_path is not None:
            unet, sched_config = load_local(Path(model_path), scheduler)
        else:
            unet, sched_config = tiny_unet(seed), None
        self.scheduler = PerSampleScheduler(make_scheduler(scheduler, sched_config), eta=eta)
        self._half = fp16 and self._device.type == "cuda"
        unet = unet.eval().to(self._device)
        if self._half:
            unet = unet.half()
        self.unet = unet

        cfg = unet.config
        size = cfg.sample_size
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        self.sample_shape = (int(cfg.in_channels), int(h), int(w))
        self.inputs = [SEED_SPEC, STEPS_SPEC]
        self.outputs = [TensorSpec("image", (int(cfg.out_channels), int(h), int(w)), "FP32")]
        self.max_batch_size = max_batch_size
        self.batch_sizes: list[int] | None = None
        self.default_steps = default_steps
        self.max_steps = min(max_steps, self.scheduler.num_train_timesteps)
        if not 1 <= default_steps <= self.max_steps:
            raise ValueError(f"default_steps must be in 1..{self.max_steps}")
        # Set by the batcher that serves it (ReportsSteps); called on the engine thread.
        self.step_observer: StepObserver | None = None

    # ------------------------------------------------------------------ request checks
    def parse(self, inputs: Mapping[str, np.ndarray]) -> tuple[int, int]:
        """(seed, steps) of one request, or ValueError saying what is wrong with it.

        The server may call this before queueing, to answer 400 instead of computing.
        """
        try:
            seed = int(np.asarray(inputs["seed"]).reshape(-1)[0])
            steps = int(np.asarray(inputs["steps"]).reshape(-1)[0])
        except (KeyError, IndexError) as exc:
            raise ValueError(f"need inputs 'seed' and 'steps' with one element each ({exc})") from exc
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if steps == 0:
            steps = self.default_steps
        if not 1 <= steps <= self.max_steps:
            raise ValueError(f"steps must be in 1..{self.max_steps} (0: default {self.default_steps})")
        return seed, steps

    def validate(self, inputs: Mapping[str, np.ndarray]) -> None:
        """Raise ValueError if a request's rows (batch axis first) cannot be served (server:
        400, not queued)."""
        rows = len(next(iter(inputs.values()))) if inputs else 0
        for i in range(rows):
            self.parse({name: value[i] for name, value in inputs.items()})

    # ------------------------------------------------------------------ step contract
    def start(self, item: Mapping[str, np.ndarray]) -> DiffusionState:
        """A request's state: its schedule and its initial noise from its own generator."""
        from diffusers.utils.torch_utils import randn_tensor

        seed, steps = self.parse(item)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        noise = randn_tensor((1, *self.sample_shape), generator=generator, device=self._device)
        sample = noise * self.scheduler.init_noise_sigma
        return DiffusionState(seed, steps, self.scheduler.schedule(steps), sample, generator)

    def step(self, states: Sequence[DiffusionState]) -> None:
        """One UNet call for all ``states``, each at its own timestep; then each one's update.

        States are changed only after the whole batch succeeded, so a caller may retry
        them one by one when this raises.
        """
        if not states:
            return
        for s in states:
            if s.index >= s.steps:
                raise EngineError("step() called on a finished state")
        began = monotonic()
        t = [s.schedule.timesteps[s.index] for s in states]
        prev = [s.schedule.prev_timesteps[s.index] for s in states]
        with torch.inference_mode():
            x = torch.cat([s.sample for s in states])
            model_in = x.half() if self._half else x
            t_vec = torch.tensor(t, dtype=torch.long, device=self._device)
            eps = self.unet(model_in, t_vec).sample.float()
            gens = [s.generator for s in states] if self.scheduler.stochastic else None
            new = self.scheduler.step(eps, t, prev, x, gens)
        for i, s in enumerate(states):
            s.sample = new[i : i + 1]
            s.index += 1
        if self.step_observer is not None:
            self.step_observer(len(states), monotonic() - began)

    def finished(self, state: DiffusionState) -> bool:
        return state.index >= state.steps

    def result(self, state: DiffusionState) -> dict[str, np.ndarray]:
        """The image in [0, 1] (diffusers' own x/2 + 0.5, clamped), FP32 [C, H, W]."""
        if not self.finished(state):
            raise EngineError(f"result() asked after {state.index} of {state.steps} steps")
        with torch.inference_mode():
            image = (state.sample[0].float() / 2 + 0.5).clamp(0, 1)
            return {"image": image.cpu().numpy()}

    # ------------------------------------------------------------------ request contract
    def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run every item to completion together; short requests leave the batch early."""
        n = len(batch["seed"])
        states = [self.start({name: batch[name][i] for name in ("seed", "steps")}) for i in range(n)]
        active = list(states)
        while active:
            self.step(active)
            active = [s for s in active if not self.finished(s)]
        return {"image": np.stack([self.result(s)["image"] for s in states])}

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """One UNet step at each batch size (cheaper than ``infer`` on zeros: 1 step, not 20)."""
        item: dict[str, np.ndarray] = {"seed": np.zeros(1, np.int64), "steps": np.ones(1, np.int32)}
        observer, self.step_observer = self.step_observer, None  # warm-up is not traffic
        try:
            for n in batch_sizes:
                self.step([self.start(item) for _ in range(n)])
        finally:
            self.step_observer = observer

    def close(self) -> None:
        self.unet = None
        if self._device.type == "cuda":
            torch.cuda.empty_cache()
